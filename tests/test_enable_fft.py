"""torch.fft and torch.stft / istft under carbon.enable (docs/enable.md, carbon/_enable_fft.py): the transforms
against an exact oracle of the documented definition (twiddles from the octant reduction and mpmath, every exact
sum by Fractions, the four-step products in numpy float32), their windows and overlap-add against oracles of
torch's sequences, accuracy against torch's float64 transforms, batch and thread invariance, refusals, and the
clients: an FNO spectral layer and a multi-resolution STFT loss training under strict mode."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

import carbon
from tests.oracle import as_bits, assert_bits_equal, bits_tensor, round_bits, round_value

pytestmark = pytest.mark.usefixtures("carbon_disabled_after")
F32 = torch.float32


# ---- an independent oracle of the definition --------------------------------------------------------------

def _rn64(v) -> float:
    return float(mpmath.mpf(v)) if not isinstance(v, float) else v


def _cos_sin_64(theta: float) -> tuple:
    """RN64(cos θ), RN64(sin θ) from mpmath at 200 bits (carbon's float64 functions are correctly rounded
    outside 2⁻⁴⁵ ulp of a midpoint)."""
    with mpmath.workprec(200):
        return float(mpmath.cos(mpmath.mpf(theta))), float(mpmath.sin(mpmath.mpf(theta)))


def _f32(v: float) -> float:
    return float(np.float32(v))


def twiddle(m: int, n: int) -> tuple:
    """(cos, sin)(2πm/n) as docs/enable.md defines the float32 table: quadrant and octant in integers."""
    m %= n
    quadrant, r = divmod(4 * m, n)
    mirrored = 2 * r > n
    rr = n - r if mirrored else r
    theta = (math.pi / 2 * rr) / n  # two binary64 operations, as documented
    c64, s64 = _cos_sin_64(theta)
    c, s = _f32(c64), _f32(s64)
    if 2 * r == n:
        s = c
    a, b = (s, c) if mirrored else (c, s)
    c, s = [(a, b), (-b, a), (-a, -b), (b, -a)][quadrant]
    return c + 0.0, s + 0.0


def largest_divisor_below_root(n: int) -> int:
    best = 1
    for d in range(2, math.isqrt(n) + 1):
        if n % d == 0:
            best = d
    return best


def _exact_dft(re: list, im: list, forward: bool, outputs: int, table: dict) -> tuple:
    """One rounding per part of the exact Σ z_j·w^{jk} (w = c − iσs)."""
    n = len(re)
    sigma = 1 if forward else -1
    yr, yi = [], []
    for k in range(outputs):
        sr, si = Fraction(0), Fraction(0)
        for j in range(n):
            c, s = table[(j * k) % n]
            zr, zi = Fraction(re[j]), Fraction(im[j])
            sr += zr * Fraction(c) + sigma * zi * Fraction(s)
            si += zi * Fraction(c) - sigma * zr * Fraction(s)
        yr.append(float(round_value(sr, F32)))
        yi.append(float(round_value(si, F32)))
    return yr, yi


def dft(re: list, im: list, forward: bool, outputs: int = None) -> tuple:
    """The documented transform of one signal (direct, or the four steps recursively)."""
    n = len(re)
    outputs = n if outputs is None else outputs
    n1 = largest_divisor_below_root(n)
    table = {m: twiddle(m, n) for m in range(n)}
    if n <= 64 or n1 == 1:
        return _exact_dft(re, im, forward, outputs, table)
    n2 = n // n1
    a = [dft([re[j1 + n1 * j2] for j2 in range(n2)], [im[j1 + n1 * j2] for j2 in range(n2)], forward)
         for j1 in range(n1)]
    b = []
    for j1 in range(n1):
        row_r, row_i = [], []
        for k2 in range(n2):
            c, s = table[(j1 * k2) % n]
            wr, wi = np.float32(c), np.float32(-s if forward else s)
            ar, ai = np.float32(a[j1][0][k2]), np.float32(a[j1][1][k2])
            row_r.append(float(ar * wr - ai * wi))  # numpy float32: each product and the sum rounded
            row_i.append(float(ar * wi + ai * wr))
        b.append((row_r, row_i))
    x = [dft([b[j1][0][k2] for j1 in range(n1)], [b[j1][1][k2] for j1 in range(n1)], forward) for k2 in range(n2)]
    out_r, out_i = [0.0] * n, [0.0] * n
    for k2 in range(n2):
        for k1 in range(n1):
            out_r[k2 + n2 * k1], out_i[k2 + n2 * k1] = x[k2][0][k1], x[k2][1][k1]
    return out_r[:outputs], out_i[:outputs]


def _complex_bits(re: list, im: list) -> torch.Tensor:
    return bits_tensor([[round_bits(a, F32), round_bits(b, F32)] for a, b in zip(re, im)], F32)


def _signal(seed: int, *shape: int, complex_: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, 2 if complex_ else 1, generator=g) * torch.exp2(torch.randint(-8, 9, (*shape, 1), generator=g).float())
    return torch.view_as_complex(x.contiguous()) if complex_ else x[..., 0].contiguous()


# ---- the one-dimensional transforms against the oracle -------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 30, 64, 65, 100, 67])
def test_complex_transform_is_the_documented_sequence(n):
    """Direct lengths (≤ 64; 67 is prime) and four-step ones (65 = 5·13, 100 = 10·10), forward and inverse."""
    z = _signal(n, 2, n, complex_=True)
    with carbon.enabled():
        forward = torch.fft.fft(z)
        inverse = torch.fft.ifft(z, norm="forward")  # no division: the bare inverse sum
    for row in range(2):
        re, im = z[row].real.tolist(), z[row].imag.tolist()
        assert_bits_equal(torch.view_as_real(forward[row]), _complex_bits(*dft(re, im, True)), f"fft n={n}")
        assert_bits_equal(torch.view_as_real(inverse[row]), _complex_bits(*dft(re, im, False)), f"ifft n={n}")


@pytest.mark.parametrize("n", [8, 9, 65])
def test_real_transform_and_its_inverse_are_the_documented_sequence(n):
    x = _signal(10 + n, 2, n)
    spectrum = _signal(20 + n, 2, n // 2 + 1, complex_=True)
    with carbon.enabled():
        half = torch.fft.rfft(x)
        full = torch.fft.fft(x)  # a real signal's full transform: _fft_r2c with onesided=False
        signal = torch.fft.irfft(spectrum, n=n, norm="forward")
    for row in range(2):
        zeros = [0.0] * n
        assert_bits_equal(torch.view_as_real(half[row]), _complex_bits(*dft(x[row].tolist(), zeros, True, n // 2 + 1)))
        assert_bits_equal(torch.view_as_real(full[row]), _complex_bits(*dft(x[row].tolist(), zeros, True)))
        # the Hermitian spectrum: Y[n−k] = conj Y[k]; the imaginary parts of Y[0] and Y[n/2] read as +0
        re, im = spectrum[row].real.tolist(), spectrum[row].imag.tolist()
        im[0] = 0.0
        if n % 2 == 0:
            im[-1] = 0.0
        re_full = re + [re[k] for k in range((n + 1) // 2 - 1, 0, -1)]
        im_full = im + [-im[k] for k in range((n + 1) // 2 - 1, 0, -1)]
        want = dft(re_full, im_full, False)[0]
        assert_bits_equal(signal[row], bits_tensor([round_bits(v, F32) for v in want], F32), f"irfft n={n}")


def test_normalization_is_one_division_at_the_end():
    z = _signal(30, 2, 12, complex_=True)
    with carbon.enabled():
        bare = torch.fft.fft(z)
        by_n = torch.fft.ifft(z)  # 'backward': the inverse divided by n
        bare_inverse = torch.fft.ifft(z, norm="forward")
        ortho = torch.fft.fft(z, norm="ortho")
    root = round_value(math.sqrt(12), F32)  # √12 rounded once (binary64's √ is correctly rounded, far from a tie)
    for got, base, divisor in ((by_n, bare_inverse, Fraction(12)), (ortho, bare, root)):
        want = [round_bits(Fraction(v) / divisor, F32) for v in torch.view_as_real(base).reshape(-1).tolist()]
        assert_bits_equal(torch.view_as_real(got).reshape(-1), bits_tensor(want, F32))


def test_several_dimensions_are_transformed_in_the_listed_order():
    z, x = _signal(31, 3, 6, 10, complex_=True), _signal(32, 3, 6, 10)
    with carbon.enabled():
        assert torch.equal(as_bits(torch.view_as_real(torch.fft.fft2(z))),
                           as_bits(torch.view_as_real(torch.fft.fft(torch.fft.fft(z, dim=-2), dim=-1))))
        assert torch.equal(as_bits(torch.view_as_real(torch.fft.rfft2(x))),
                           as_bits(torch.view_as_real(torch.fft.fft(torch.fft.rfft(x, dim=-1), dim=-2))))
        spectrum = torch.fft.rfft2(x)  # the inverse unscaled ("forward"): the normalization is one division at the end
        assert torch.equal(as_bits(torch.fft.irfft2(spectrum, s=(6, 10), norm="forward")),
                           as_bits(torch.fft.irfft(torch.fft.ifft(spectrum, dim=-2, norm="forward"), n=10, dim=-1,
                                                   norm="forward")))


def test_twiddle_table_is_exactly_symmetric():
    from carbon._enable_fft import _twiddle_table
    for n in (4, 8, 12, 30, 64, 100, 1024):
        c, s = _twiddle_table(n)
        m = torch.arange(1, n)
        assert torch.equal(c[m], c[n - m]) and torch.equal(s[m], -s[n - m]), n
        if n % 4 == 0:
            assert c[n // 4].item() == 0.0 and math.copysign(1, c[n // 4].item()) == 1 and s[n // 4].item() == 1.0


# ---- accuracy, invariance, refusals ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 31, 64, 128, 400, 1000, 2039, 4096, 65536])
def test_transforms_are_accurate(n):
    """Against torch's float64 transforms: the direct sums are exact and the four steps round three times per
    level, so the error stays near float32's precision relative to the signal."""
    x = torch.randn(2, n, generator=torch.Generator().manual_seed(n))
    z = torch.randn(2, n, dtype=torch.complex64, generator=torch.Generator().manual_seed(n + 1))
    with carbon.enabled():
        got = [torch.fft.rfft(x), torch.fft.fft(z), torch.fft.irfft(torch.fft.rfft(x), n=n)]
    want = [torch.fft.rfft(x.double()), torch.fft.fft(z.to(torch.complex128)), x.double()]
    for g, w in zip(got, want):
        scale = w.abs().max().item()
        assert (g.to(w.dtype) - w).abs().max().item() <= 4e-7 * scale * max(1.0, math.log2(n)), n


def test_rows_batch_and_threads_do_not_change_a_bit(restore_num_threads):
    x = _signal(40, 6, 5, 200)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with carbon.enabled():
            results.append((torch.fft.rfft2(x), torch.fft.rfft2(x[:1]), torch.fft.irfft(torch.fft.rfft(x), n=200)))
    for whole, one, back in results:
        assert torch.equal(as_bits(torch.view_as_real(whole[:1])), as_bits(torch.view_as_real(one)))
    for a, b in zip(*results):
        assert torch.equal(as_bits(torch.view_as_real(a) if a.is_complex() else a),
                           as_bits(torch.view_as_real(b) if b.is_complex() else b))


def test_uncovered_transforms_are_refused():
    with carbon.enabled():
        with pytest.raises(carbon.NotExactError, match="prime length"):
            torch.fft.fft(torch.randn(2053, dtype=torch.complex64))  # a prime above 2048
        with pytest.raises(carbon.NotExactError, match="float64"):
            torch.fft.rfft(torch.randn(16, dtype=torch.float64))
        with pytest.raises(RuntimeError, match="Invalid number of data points"):
            torch.fft.rfft(torch.randn(3), n=0)


def test_out_variants_empty_batches_and_sample_frequencies():
    x = _signal(41, 3, 12)
    with carbon.enabled():
        want = torch.fft.rfft(x)
        out = torch.empty(3, 7, dtype=torch.complex64)
        torch.fft.rfft(x, out=out)
        assert torch.equal(as_bits(torch.view_as_real(out)), as_bits(torch.view_as_real(want)))
        assert torch.fft.rfft(torch.randn(0, 12)).shape == (0, 7)
        freqs = torch.fft.fftfreq(8, d=0.5), torch.fft.rfftfreq(9)  # integers times RN32(1/(n·d)): allowed
    assert freqs[0].tolist() == [0.0, 0.25, 0.5, 0.75, -1.0, -0.75, -0.5, -0.25]
    assert freqs[1].tolist() == [float(np.float32(k) * np.float32(1 / 9)) for k in range(5)]


# ---- gradients and the clients ------------------------------------------------------------------------------

class SpectralConv2d(torch.nn.Module):
    """The Fourier layer of a Fourier neural operator (Li et al.; neuraloperator's SpectralConv): rfft2, a complex
    einsum of the lowest modes with complex weights, irfft2; plus a pointwise linear path."""

    def __init__(self, channels: int, modes: int) -> None:
        super().__init__()
        self.modes = modes
        scale = 1 / (channels * channels)
        self.weights = torch.nn.Parameter(scale * torch.rand(channels, channels, modes, modes, dtype=torch.cfloat))
        self.pointwise = torch.nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        xf = torch.fft.rfft2(x)
        out = torch.zeros(b, c, h, w // 2 + 1, dtype=torch.cfloat, device=x.device)
        m = self.modes
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", xf[:, :, :m, :m], self.weights)
        return torch.nn.functional.gelu(torch.fft.irfft2(out, s=(h, w)) + self.pointwise(x))


def _train_fno(steps: int, threads: int, device: str = "cpu") -> tuple:
    torch.set_num_threads(threads)
    with carbon.enabled(seed=3):
        model = torch.nn.Sequential(SpectralConv2d(4, 5), SpectralConv2d(4, 5)).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        x = torch.randn(3, 4, 16, 16, device=device)
        target = torch.randn(3, 4, 16, 16, device=device)
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    return float(loss.detach()), carbon.fingerprint(model, optimizer)


def test_fourier_neural_operator_trains_under_strict_mode_with_the_same_bits_at_any_thread_count(restore_num_threads):
    loss1, print1 = _train_fno(3, 1)
    loss2, print2 = _train_fno(3, 2)
    assert print1 == print2 and loss1 == loss2 and math.isfinite(loss1)


def test_spectral_layer_gradients_are_close_to_float64():
    torch.manual_seed(0)
    layer = SpectralConv2d(3, 4)
    x = torch.randn(2, 3, 12, 12, requires_grad=True)
    with carbon.enabled():
        layer(x).square().sum().backward()
    got = [x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]
    x.grad = None
    layer.zero_grad()
    layer64 = SpectralConv2d(3, 4)
    layer64.pointwise.double()  # Module.double() would drop the complex weights' imaginary parts
    with torch.no_grad():
        layer64.weights = torch.nn.Parameter(layer.weights.detach().to(torch.complex128))
        layer64.pointwise.weight.copy_(layer.pointwise.weight.double())
        layer64.pointwise.bias.copy_(layer.pointwise.bias.double())
    x64 = x.detach().double().requires_grad_()

    def forward64(inp):  # the same layer in float64 / complex128
        b, c, h, w = inp.shape
        xf = torch.fft.rfft2(inp)
        out = torch.zeros(b, c, h, w // 2 + 1, dtype=torch.complex128)
        out[:, :, :4, :4] = torch.einsum("bixy,ioxy->boxy", xf[:, :, :4, :4], layer64.weights)
        return torch.nn.functional.gelu(torch.fft.irfft2(out, s=(h, w)) + layer64.pointwise(inp))
    forward64(x64).square().sum().backward()
    want = [x64.grad] + [p.grad for p in layer64.parameters()]
    for g, w in zip(got, want):
        assert (g.to(w.dtype) - w).abs().max().item() <= 1e-5 * w.abs().max().item()


def _stft_loss(wave: torch.Tensor) -> torch.Tensor:
    """A multi-resolution STFT loss (Parallel WaveGAN / HiFi-GAN vocoders): log-magnitude and spectral
    convergence terms over three (n_fft, hop) settings with Hann windows."""
    target = torch.sin(torch.arange(wave.shape[-1], dtype=torch.float32) * 0.05)
    total = 0
    for n_fft, hop in ((64, 16), (128, 32), (200, 50)):
        window = torch.hann_window(n_fft)
        s = torch.stft(wave, n_fft, hop_length=hop, window=window, return_complex=True).abs()
        t = torch.stft(target.expand_as(wave), n_fft, hop_length=hop, window=window, return_complex=True).abs()
        total = total + torch.linalg.vector_norm(t - s) / torch.linalg.vector_norm(t) \
            + torch.nn.functional.l1_loss(torch.log(s + 1e-7), torch.log(t + 1e-7))
    return total


def test_stft_loss_gradient_runs_under_strict_mode_with_the_same_bits_at_any_thread_count(restore_num_threads):
    grads = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        wave = _signal(50, 2, 800).requires_grad_()
        with carbon.enabled():
            _stft_loss(wave).backward()
        grads.append(as_bits(wave.grad))
    assert torch.equal(grads[0], grads[1])


def test_istft_inverts_stft_under_strict_mode():
    wave = _signal(51, 2, 1000)
    window = torch.hann_window(256)
    with carbon.enabled():
        spec = torch.stft(wave, 256, hop_length=64, window=torch.hann_window(256), return_complex=True)
        back = torch.istft(spec, 256, hop_length=64, window=torch.hann_window(256), length=1000)
    want = torch.istft(torch.stft(wave.double(), 256, hop_length=64, window=window.double(), return_complex=True),
                       256, hop_length=64, window=window.double(), length=1000)
    assert (back.double() - want).abs().max().item() <= 1e-6 * wave.abs().max().item()


# ---- windows and overlap-add ------------------------------------------------------------------------------------

def _exact(v: mpmath.mpf) -> Fraction:
    sign, man, exp, _ = v._mpf_
    return (-1) ** sign * Fraction(int(man)) * Fraction(2) ** int(exp)


def _cos32(x: Fraction) -> Fraction:
    """RN32(cos x) (carbon's float32 cos is correctly rounded outside ~2⁻²⁰ ulp of a midpoint)."""
    with mpmath.workprec(200):
        return round_value(_exact(mpmath.cos(mpmath.mpf(float(x)))), F32)


def _window_oracle(kind: str, length: int, periodic: bool) -> list:
    """torch's sequence (TensorFactories.cpp) with one rounding per operation: the scalars are binary64
    expressions, rounded to float32 when they meet the float32 positions."""
    if length == 1:
        return [Fraction(1)]  # torch's ones
    n = length + 1 if periodic else length
    rn = lambda v: round_value(v, F32)  # noqa: E731
    out = []
    for i in range(n):
        if kind in ("hann", "hamming"):
            alpha, beta = (0.5, 0.5) if kind == "hann" else (0.54, 0.46)
            x = rn(Fraction(i) * rn(Fraction(math.pi * 2.0 / (n - 1))))
            out.append(rn(rn(_cos32(x) * rn(Fraction(-beta))) + rn(Fraction(alpha))))
        elif kind == "blackman":
            x = rn(Fraction(i) * rn(Fraction(math.pi / (n - 1))))
            four = rn(_cos32(rn(4 * x)) * rn(Fraction(0.08)))
            two = rn(_cos32(rn(2 * x)) * rn(Fraction(0.5)))
            out.append(rn(rn(four - two) + rn(Fraction(0.42))))
        else:  # bartlett
            x = rn(Fraction(i) * rn(Fraction(2.0 / (n - 1))))
            out.append(x if i < ((n - 1) >> 1) + 1 else rn(2 - x))
    return out[:length]


@pytest.mark.parametrize("kind", ["hann", "hamming", "blackman", "bartlett"])
@pytest.mark.parametrize("length,periodic", [(1, True), (16, True), (25, False), (400, True)])
def test_windows_are_torch_sequences_with_carbons_cos(kind, length, periodic):
    with carbon.enabled():
        got = getattr(torch, f"{kind}_window")(length, periodic=periodic)
    want = _window_oracle(kind, length, periodic)
    assert_bits_equal(got, bits_tensor([round_bits(v, F32) for v in want], F32), f"{kind} {length}")
    assert torch.allclose(got, getattr(torch, f"{kind}_window")(length, periodic=periodic), atol=1e-6)


def test_unfold_gradient_is_the_exact_sum_of_overlapping_windows():
    x = _signal(60, 3, 40).requires_grad_()
    windows = x.unfold(1, 9, 2)  # 16 windows of 9, overlapping by 7
    g = _signal(61, *windows.shape)
    with carbon.enabled():
        windows.backward(g)
    want = []
    for r in range(3):
        row = []
        for p in range(40):
            total = sum((Fraction(g[r, w, p - 2 * w].item()) for w in range(windows.shape[1]) if 0 <= p - 2 * w < 9),
                        Fraction(0))
            row.append(round_bits(total, F32))
        want.append(row)
    assert_bits_equal(x.grad, bits_tensor(want, F32))
