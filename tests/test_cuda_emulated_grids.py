"""Carbon's CUDA kernels give the same bits whatever the grid: the emulated device run with 1, 2 and 5 SMs
(blocks_for's grids of at most 32, 64 and 160 blocks; reduce_cuda.cu splits long rows only when there are
fewer than 4 rows per SM; column_sums.cuh cuts columns into as many chunks of rows as fill 2048 threads per
SM) and different fiber schedules, each in a process of its own, returns the CPU kernels' bits for a set of
ops with ties (exact tiers), long rows, many rows and columns."""

import os
import subprocess
import sys

import pytest
import torch

import carbon  # noqa: F401  (registers torch.ops.carbon)
from emulated import emulated_ops

TESTS = os.path.dirname(os.path.abspath(__file__))

# Each case: an op and arguments built from a seeded generator; the child and this process build the same ones.
CASES = """
import hashlib
import torch
from data import generator, random_values, softmax_tie_rows

def digest(out):
    h = hashlib.sha256()
    for t in out if isinstance(out, (tuple, list)) else (out,):
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()

def cases():
    g = generator(11)
    x = random_values((6, 70000), torch.float32, g)  # split into chunks with 2 or 5 SMs, not with 1
    x[:, 35000:] = -x[:, :35000]
    x[:, -1] = 2.0**-30
    many = random_values((700, 33), torch.bfloat16, g)
    a, b = random_values((45, 300), torch.float32, g), random_values((300, 29), torch.float32, g)
    a[::3, 150:] = -a[::3, :150]
    b[150:] = b[:150]
    ties = softmax_tie_rows(torch.float32)
    w, bias = random_values((513,), torch.float32, g), random_values((513,), torch.float32, g)
    rows = random_values((130, 513), torch.float16, g)
    logits = random_values((90, 1000), torch.float32, g)
    target = torch.randint(0, 1000, (90,), generator=g)
    index = torch.randint(0, 5, (4000,), generator=g)
    src = random_values((4000, 7), torch.float32, g)
    cols = random_values((5000, 40), torch.float32, g)  # column kernels: 32, 64 or 157 chunks of rows
    cols[2500:, ::3] = -cols[:2500, ::3]
    nx, ndy = random_values((300, 48), torch.float32, g), random_values((300, 48), torch.float32, g)
    nmean, nrstd = random_values((300,), torch.float32, g), random_values((300,), torch.float32, g).abs() + 0.5
    return [
        ("sum", (x, [1])), ("sum", (x, [0])), ("mean", (many, [1])), ("sum", (many, None)),
        ("mm", (a, b)), ("addmm", (w[:29], a, b)),
        ("softmax", (ties, 1)), ("log_softmax", (logits, 1)),
        ("layer_norm", (rows, [513], w.half(), bias.half(), 1e-5)), ("rms_norm", (rows, [513], None, None)),
        ("cross_entropy", (logits, target, 1, -100, 0.1)),
        ("index_add", (torch.zeros(5, 7), 0, index, src)),
        ("cumsum_rows", (many, None)),
        ("mean", (cols, [0])), ("sum", (cols[:, :33].contiguous(), [0])),
        ("norm_backward", (ndy, nx, [48], nmean, nrstd, None, [False, True, True])),
    ]
"""

CHILD = """
import sys
sys.path.insert(0, {tests!r})
from cuda_emulator.build import load
exec({cases!r})
emu = load()
for name, args in cases():
    print("digest", name, digest(getattr(emu, name)(*args)))
"""


def digests_here():
    """The CPU kernels' digests of the same cases."""
    namespace = {}
    exec(CASES, namespace)
    return [f"digest {name} {namespace['digest'](getattr(torch.ops.carbon, name)(*args))}"
            for name, args in namespace["cases"]()]


@pytest.mark.parametrize("sms,seed", [(1, 3), (2, 0), (5, 7)])
def test_same_bits_on_every_grid(sms, seed):
    emulated_ops()  # built (or skipped) here
    env = dict(os.environ, CARBON_CUDA_EMULATOR_SMS=str(sms), CARBON_CUDA_EMULATOR_SEED=str(seed))
    proc = subprocess.run([sys.executable, "-c", CHILD.format(tests=TESTS, cases=CASES)], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = [line for line in proc.stdout.splitlines() if line.startswith("digest ")]
    want = digests_here()
    bad = [w.split()[1] for w, g in zip(want, got) if w != g]
    assert len(got) == len(want) and not bad, f"{sms} SMs, schedule seed {seed}: ops whose bits differ: {bad}"
