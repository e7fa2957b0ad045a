"""Fourier transforms, windows and overlap-add under carbon.enable on a GPU: the CPU's bits (cuFFT's
would differ), and a Fourier-neural-operator training step with the CPU's fingerprint. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

import carbon
from tests.conftest import ON_GPU
from tests.oracle import as_bits
from tests.test_enable_fft import SpectralConv2d, _stft_loss

pytestmark = ON_GPU + [pytest.mark.usefixtures("carbon_disabled_after")]


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    return as_bits(torch.view_as_real(t) if t.is_complex() else t)


def _transforms(x: torch.Tensor, z: torch.Tensor) -> list:
    return [torch.fft.rfft(x), torch.fft.fft(x), torch.fft.irfft(torch.fft.rfft(x), n=x.shape[-1]),
            torch.fft.fft(z), torch.fft.ifft(z, norm="ortho"), torch.fft.fft2(z), torch.fft.rfft2(x),
            torch.fft.irfft2(torch.fft.rfft2(x), s=x.shape[-2:])]


@pytest.mark.parametrize("n", [16, 67, 100, 4096])
def test_transforms_on_the_gpu_equal_the_cpu(n):
    x = torch.randn(3, 4, n, generator=torch.Generator().manual_seed(n))
    z = torch.randn(3, 4, n, dtype=torch.complex64, generator=torch.Generator().manual_seed(n + 1))
    with carbon.enabled():
        want = _transforms(x, z)
        got = _transforms(x.cuda(), z.cuda())
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device.type == "cuda" and torch.equal(_bits(g), _bits(w)), i


def test_windows_stft_and_overlap_add_on_the_gpu_equal_the_cpu():
    wave = torch.randn(2, 900, generator=torch.Generator().manual_seed(5))
    results = {}
    for device in ("cpu", "cuda"):
        w = wave.to(device).requires_grad_()
        with carbon.enabled():
            windows = [f(128, device=device) for f in (torch.hann_window, torch.hamming_window,
                                                       torch.blackman_window, torch.bartlett_window)]
            spec = torch.stft(w.detach(), 128, hop_length=32, window=windows[0], return_complex=True)
            back = torch.istft(spec, 128, hop_length=32, window=windows[0], length=900)
            _stft_loss(w).backward()
        results[device] = [*windows, spec, back, w.grad]
    for i, (g, c) in enumerate(zip(results["cuda"], results["cpu"])):
        assert torch.equal(_bits(g), _bits(c)), i


def test_a_fourier_neural_operator_step_on_the_gpu_has_the_cpus_fingerprint():
    prints = {}
    for device in ("cpu", "cuda"):
        with carbon.enabled(seed=3):
            model = torch.nn.Sequential(SpectralConv2d(4, 5), SpectralConv2d(4, 5)).to(device)
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
            x, target = torch.randn(3, 4, 16, 16, device=device), torch.randn(3, 4, 16, 16, device=device)
            for _ in range(2):
                torch.nn.functional.mse_loss(model(x), target).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
        prints[device] = carbon.fingerprint(model, optimizer)
    assert prints["cuda"] == prints["cpu"]
