"""One training step of an ordinary torch.nn GPT (Hugging Face-free, GPT-2
layout: pre-LayerNorm blocks, causal SDPA, GELU MLP, tied-free LM head,
cross-entropy, clip_grad_norm_, AdamW) under carbon.enable against plain
PyTorch: float32 (TF32 off), TF32 (CUDA) and bfloat16 autocast.

    python benchmarks/bench_enable.py [--device cpu|cuda|all] [--budget S] [--size small|tiny] [--modes M,M]

CUDA: the GPT-2 small configuration (124M parameters, 12 layers, d = 768,
batch 8 x 1024 tokens). CPU: a smaller configuration (4 layers, d = 256,
batch 8 x 128, vocabulary 8192). Each row: median ms per step and the ratio
to plain float32. Targets (issue 5): H200 <= 1.5x plain float32; CPU <= 3x.
The tables end with one RATIO line per plain mode timed (carbon.enable / that
mode; the lines scripts/device_check.sh's summary collects), the target on the
float32 line of the configurations it was set for (not --size tiny).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import carbon
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_load, print_report, time_interleaved  # noqa: E402

CONFIGS = {
    "small": dict(vocab=50304, d=768, heads=12, layers=12, ctx=1024, batch=8),
    "cpu": dict(vocab=8192, d=256, heads=4, layers=4, ctx=128, batch=8),
    "tiny": dict(vocab=512, d=64, heads=4, layers=2, ctx=64, batch=4),
}

# carbon.enable / plain float32 targets of the module docstring (issue 5), by device, for the configuration
# each was set for (GPT-2 small on CUDA, "cpu" on the CPU); shown on the RATIO lines
TARGETS = {("cuda", "small"): 1.5, ("cpu", "cpu"): 3.0}


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out, self.act = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.GELU(approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, ctx: int, **_) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.lnf, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.lnf(x))


def make_step(cfg: dict, device: str, mode: str, model: nn.Module):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(1)
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["ctx"]), generator=g).to(device)
    target = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["ctx"]), generator=g).to(device)

    def context():
        if mode == "carbon.enable":
            return carbon.enabled()
        if mode == "bf16 autocast":
            return torch.autocast(device_type=device, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step():
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            torch.backends.cudnn.allow_tf32 = mode == "tf32"
        with context():
            logits = model(idx)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), target.view(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


def run(device: str, size: str, budget: float, only: Optional[List[str]] = None) -> Tuple[List[str], List[str]]:
    """The table's lines and the RATIO lines (carbon.enable / each plain mode) on `device`."""
    name = size if device == "cuda" or size == "tiny" else "cpu"
    cfg = CONFIGS[name]
    modes = ["fp32", "tf32", "bf16 autocast", "carbon.enable"] if device == "cuda" else \
        ["fp32", "bf16 autocast", "carbon.enable"]
    if only:
        modes = ["fp32"] + [m for m in modes[1:] if m in only]
    torch.manual_seed(0)
    with torch.device(device):  # built on the device (fast on a GPU); every mode trains the same model
        model = GPT(**cfg)
    steps = [make_step(cfg, device, m, model) for m in modes]
    times = time_interleaved(steps, device, budget, max_reps=20)
    medians = [statistics.median(t) for t in times]
    base = medians[0]
    shape = f"GPT {cfg['layers']} layers, d={cfg['d']}, batch {cfg['batch']}x{cfg['ctx']}, vocab {cfg['vocab']}"
    lines = [f"\n{device}: {shape} (load {machine_load()}, threads {torch.get_num_threads()}, "
             f"{len(times[0])} timed steps per mode)",
             f"| {'step':<14} | {'ms':>9} | {'/ fp32':>7} |",
             f"|{'-' * 16}|{'-' * 11}|{'-' * 9}|"]
    for m, t in zip(modes, medians):
        lines.append(f"| {m:<14} | {t:9.1f} | {t / base:6.2f}x |")
    ratios = []
    if "carbon.enable" in modes:
        ms = medians[modes.index("carbon.enable")]
        for m, t in zip(modes, medians):
            if m == "carbon.enable":
                continue
            target = TARGETS.get((device, name)) if m == "fp32" else None
            plain = "fp32 (TF32 off)" if m == "fp32" and device == "cuda" else m
            ratios.append(f"RATIO {device} enable step ({shape}) carbon.enable/{plain} = {ms / t:.2f}"
                          + (f" (target <= {target:g})" if target is not None else ""))
    return lines, ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="all", choices=["cpu", "cuda", "all"])
    parser.add_argument("--budget", type=float, default=30.0,
                        help="seconds of timed rounds per device, all modes together (a soft budget: after a "
                             "warm-up and a probe round, at least 3 and at most 20 rounds, each calling every "
                             "mode once)")
    parser.add_argument("--size", default="small", choices=["small", "tiny"])
    parser.add_argument("--modes", default=None,
                        help="comma-separated subset of: tf32, bf16 autocast, carbon.enable (fp32 always runs); "
                             "on CPUs without bfloat16 instructions torch's bf16 autocast step takes ~40x fp32 and "
                             "leaves the budget a few rounds")
    args = parser.parse_args()
    only = [m.strip() for m in args.modes.split(",")] if args.modes else None
    unknown = sorted(set(only or []) - {"fp32", "tf32", "bf16 autocast", "carbon.enable"})
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from tf32, bf16 autocast, carbon.enable")
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    lines: List[str] = []
    ratios: List[str] = []
    for device in devices:
        if device == "cuda" and not torch.cuda.is_available():
            print("cuda: no GPU, skipped")
            continue
        table, device_ratios = run(device, args.size, args.budget, only)
        lines += table
        ratios += device_ratios
    return print_report(lines, ratios)


if __name__ == "__main__":
    sys.exit(main())
