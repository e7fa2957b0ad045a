"""Same bits across builds for the elementwise ops: hashes carbon's forward
and backward outputs over float32 bit patterns (every STRIDE-th of all 2^32,
the offset moving with each block so every residue is visited), over all
65,536 bfloat16 and float16 patterns, and prints one hash per function.

    python scripts/elementwise_same_bits.py STRIDE [FUNCTION ...]

Run it with two builds (e.g. main's and a branch's) and compare the output:
the hashes must be equal. Backward outputs use two gradients per input: 1
and a fixed pseudo-random one.
"""
import hashlib
import sys

import torch

import carbon

FUNCTIONS = ["exp", "log", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu", "sin", "cos", "log1p",
             "softplus", "log_sigmoid", "expm1", "log2", "log10", "exp2", "erfc", "sinh", "cosh", "tan", "atan",
             "asin", "acos", "erfinv", "asinh", "acosh", "atanh"]
BLOCK = 1 << 24


def forward(name, x):
    if name == "gelu_tanh":
        return carbon.gelu(x, approximate="tanh")
    return getattr(torch.ops.carbon, name)(x) if name in ("softplus", "log_sigmoid") else getattr(carbon, name)(x)


def digest(name, x, h):
    y = forward(name, x)
    h.update(y.view(torch.int16 if y.element_size() == 2 else torch.int32).numpy().tobytes())
    for g in (torch.ones_like(x), torch.randn(x.shape, generator=torch.Generator().manual_seed(7)).to(x.dtype)):
        d = torch.ops.carbon.elementwise_backward(g, x, name)
        h.update(d.view(torch.int16 if d.element_size() == 2 else torch.int32).numpy().tobytes())


def main():
    stride = int(sys.argv[1])
    names = sys.argv[2:] or FUNCTIONS
    torch.set_num_threads(2)
    for name in names:
        h = hashlib.sha256()
        all16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
        digest(name, all16.view(torch.bfloat16), h)
        digest(name, all16.view(torch.float16), h)
        per_block = BLOCK // stride
        for b in range(1 << 32 >> 24):
            start = b * BLOCK + (b * 7919) % stride
            bits = torch.arange(start, start + per_block * stride, stride, dtype=torch.int64)
            bits = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32)
            digest(name, bits.view(torch.float32), h)
        print(name, h.hexdigest()[:32], flush=True)


if __name__ == "__main__":
    main()
