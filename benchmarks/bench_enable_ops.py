"""Ops routed for carbon.enable's coverage (linear algebra, samplers' gradients, scans, antialiased resizing, Fourier
transforms, complex products) against torch's own, side by side.

    python benchmarks/bench_enable_ops.py [--device cpu|cuda|all] [--budget S]

Each case is the same call with and without carbon.enable, forward only; times are medians of interleaved rounds
(benchmarks/_timing.py). These routes are Python loops over carbon's exact kernels (docs/enable.md says which
sizes they are meant for), so the ratios show the price of pinning every step down, not a tuned kernel.
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F

try:
    import carbon
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_load, parse_device_args, print_report, time_interleaved  # noqa: E402


def _cases(device: str) -> List[Tuple[str, Callable[[], object]]]:
    g = torch.Generator().manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device)

    square = randn(32, 32, 32) + 6 * torch.eye(32, device=device)
    rhs = randn(32, 32, 4)
    big = randn(128, 128) + 12 * torch.eye(128, device=device)
    skew = randn(8, 64, 64, scale=0.125)
    scan = randn(64, 512)
    image = torch.rand(4, 3, 224, 224, generator=g).to(device)
    alpha = (torch.rand(65536, generator=g) * 10 + 0.05).to(device)
    sample = (torch.rand(65536, generator=g) * 10 + 1e-3).to(device)
    field = randn(8, 16, 64, 64)  # an FNO layer's input: batch 8, 16 channels, a 64x64 grid
    wave = randn(8, 16000)  # one second of 16 kHz audio, batch 8
    hann = torch.hann_window(400, device=device)
    modes = torch.complex(randn(8 * 16, 16, 16), randn(8 * 16, 16, 16))
    weights = torch.complex(randn(8 * 16, 16, 16), randn(8 * 16, 16, 16))
    signal = torch.complex(randn(64, 4096), randn(64, 4096))
    return [
        ("linalg.solve 32 x (32x32), 4 rhs", lambda: torch.linalg.solve(square, rhs)),
        ("linalg.slogdet 32 x (32x32)", lambda: torch.linalg.slogdet(square)),
        ("linalg.inv 128x128", lambda: torch.linalg.inv(big)),
        ("linalg.matrix_exp 8 x (64x64)", lambda: torch.linalg.matrix_exp(skew)),
        ("logcumsumexp 64x512, dim 1", lambda: torch.logcumsumexp(scan, 1)),
        ("interpolate antialias 4x3x224x224 -> 112", lambda: F.interpolate(image, size=(112, 112), mode="bilinear",
                                                                           antialias=True)),
        ("_standard_gamma_grad 65536", lambda: torch._standard_gamma_grad(alpha, sample)),
        ("rfft2 8x16x64x64 (direct)", lambda: torch.fft.rfft2(field)),
        ("irfft2 8x16x64x33 -> 64x64", lambda: torch.fft.irfft2(torch.fft.rfft2(field), s=(64, 64))),
        ("stft 8x16000, n_fft 400 (four-step 16x25)", lambda: torch.stft(wave, 400, hop_length=160, window=hann,
                                                                       return_complex=True)),
        ("fft 64x4096 complex (four-step 64x64)", lambda: torch.fft.fft(signal)),
        ("complex bmm 128 x (16x16 @ 16x16)", lambda: torch.bmm(modes, weights)),
    ]


def bench(device: str, budget_s: float) -> List[dict]:
    rows = []
    for name, fn in _cases(device):
        def routed(fn=fn):
            with carbon.enabled():
                fn()
        times = time_interleaved([fn, routed], device, budget_s, 20)
        ms = [statistics.median(t) for t in times]
        rows.append({"case": name, "torch": ms[0], "carbon": ms[1]})
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    args, devices = parse_device_args(__doc__.split("\n")[0], 1.0, argv)
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {torch.get_num_threads()} CPU threads, "
          f"load {machine_load()}")
    lines = ["| device | case (forward) | torch ms | carbon.enable ms | carbon/torch |", "|---|---|---|---|---|"]
    ratios = []
    for device in devices:
        for r in bench(device, args.budget):
            ratio = r["carbon"] / r["torch"]
            lines.append(f"| {device} | {r['case']} | {r['torch']:.3f} | {r['carbon']:.3f} | {ratio:.2f}x |")
            ratios.append(f"RATIO {device} enable-ops {r['case']} carbon/torch = {ratio:.2f}")
    return print_report(lines, ratios)


if __name__ == "__main__":
    sys.exit(main())
