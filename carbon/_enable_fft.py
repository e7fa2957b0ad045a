"""carbon.enable's routes for torch.fft (fft, ifft, rfft, irfft, hfft, fftn, rfft2, ... and torch.stft / istft's
transforms: aten._fft_r2c, _fft_c2c, _fft_c2r) and the windows torch.stft is given (hann, hamming, blackman,
bartlett). docs/enable.md has the definitions; float32 / complex64 only (windows: also float64).

torch's FFTs (pocketfft on the CPU, cuFFT on a GPU) choose their radices, twiddle precision and summation order per
device and per size, so the same signal gives different bits on each. Here a one-dimensional transform of length n
is a fixed sequence of exact dot products:

* Twiddles w_m = cos(2πm/n) ∓ i·sin(2πm/n), each part a float32 value computed once on the host from carbon's
  float64 cos / sin after an exact reduction of m to the first octant, so that the table is exactly symmetric
  (w_{n−m} is the conjugate of w_m; cos(π/2) is +0, not a rounding error).
* n ≤ 64, or n with no divisor in [2, √n] (n prime, up to 2048): every output is RN(exact Σ_j z_j·w_{jk mod n}), one
  rounding per part (carbon.mm of [re, im] against the block twiddle matrix [[C, ∓S], [±S, C]]; every product of
  float32 values is exact, so any order gives the same sum).
* Otherwise n = n₁·n₂ with n₁ the largest divisor of n not above √n (Cooley–Tukey's four steps, each sub-transform
  defined by this same rule): with j = j₁ + n₁·j₂ and k = k₂ + n₂·k₁, A[j₁, k₂] = DFT_{n₂} over j₂ of z[j₁ + n₁·j₂];
  B = A·w^{j₁k₂} as complex products rounded per operation (RN(RN(a·c) − RN(b·d)), RN(RN(a·d) + RN(b·c)), as
  carbon's complex mul); X[k₂ + n₂·k₁] = DFT_{n₁} over j₁ of B[j₁, k₂].

Several dimensions are transformed one after another, in the order the op lists them (r2c: the real transform
along the last listed dimension first; c2r: the complex ones first, the real one last); the normalization is one
division at the end, by n or by RN32(√n) (n the product of the signal lengths; exact for powers of two).
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor

from carbon import _enable_routes as routes
from carbon._enable_complex import from_parts, parts

__all__ = ["fft_c2c", "fft_c2r", "fft_r2c", "direct_length", "split_length", "WINDOWS"]

aten = torch.ops.aten
carbon_ops = torch.ops.carbon

_DIRECT_MAX = 64
"""Lengths up to this are one exact product per output (the block matrix is (2n)² float32 values)."""

_PRIME_MAX = 2048
"""A length with no divisor in [2, √n] above this is refused: its direct matrix would be (2n)² float32 values
(64 MB at 2048) and carbon has no exact Bluestein / Rader transform."""

_NORMALIZATIONS = (0, 1, 2)  # aten's fft_norm_mode: none, by_root_n, by_n


def split_length(n: int) -> int:
    """The largest divisor of n not above √n (1 when n is prime or 1)."""
    for d in range(math.isqrt(n), 1, -1):
        if n % d == 0:
            return d
    return 1


def direct_length(n: int) -> bool:
    """Whether a transform of length n is one exact product per output (else the four-step split)."""
    return n <= _DIRECT_MAX or split_length(n) == 1


def _check_length(n: int) -> None:
    if direct_length(n) and n > _PRIME_MAX:
        raise routes.NotCovered(f"an FFT of length {n}: a prime length above {_PRIME_MAX} (carbon has no exact "
                                "Bluestein transform; pad the signal to a composite length)")
    if not direct_length(n):
        n1 = split_length(n)
        _check_length(n1)
        _check_length(n // n1)


# ---- twiddle factors ------------------------------------------------------------------------------------------

def _twiddle_table(n: int) -> Tuple[Tensor, Tensor]:
    """(cos(2πm/n), sin(2πm/n)) for m = 0 … n−1 as float32 CPU tensors. m is reduced exactly to the first octant:
    4m = k·n + r with the quadrant k and 0 ≤ r < n; the angle θ = RN64(RN64(π/2·r') / n) with r' = r when 2r ≤ n
    (base (COS θ, SIN θ)) or r' = n − r (base (SIN θ, COS θ)); at 2r = n the base is (COS θ, COS θ). The base
    is rotated by k quarter turns exactly and every zero made +0. COS and SIN are carbon's float64 functions
    (the same bits on every host), rounded to float32."""
    m = torch.arange(n, dtype=torch.int64)
    k = torch.div(4 * m, n, rounding_mode="floor")
    r = 4 * m - k * n
    mirrored = 2 * r > n
    rr = torch.where(mirrored, n - r, r).to(torch.float64)
    theta = aten.div(aten.mul(rr, math.pi / 2), torch.full([n], float(n), dtype=torch.float64))
    cos_t = carbon_ops.cos(theta).to(torch.float32)
    sin_t = torch.where(2 * r == n, cos_t, carbon_ops.sin(theta).to(torch.float32))
    a = torch.where(mirrored, sin_t, cos_t)
    b = torch.where(mirrored, cos_t, sin_t)
    c = torch.where(k == 0, a, torch.where(k == 1, -b, torch.where(k == 2, -a, b)))
    s = torch.where(k == 0, b, torch.where(k == 1, a, torch.where(k == 2, -b, -a)))
    return c + 0.0, s + 0.0


def _twiddles(n: int, products: Tensor) -> Tuple[Tensor, Tensor]:
    """cos and sin of 2π·p/n for a tensor of non-negative integer products p (CPU)."""
    c, s = _twiddle_table(n)
    index = torch.remainder(products, n)
    return c[index], s[index]


def _direct_matrix(n: int, outputs: int, forward: bool, real_in: bool, real_out: bool,
                   device: torch.device) -> Tensor:
    """The block matrix of a length-n DFT: rows for the input's real parts (and imaginary parts unless real_in),
    columns for the first ``outputs`` outputs' real parts (and imaginary parts unless real_out). With w = c − iσs
    (σ = 1 forward, −1 inverse): y_re = Σ z_re·c + σ·z_im·s, y_im = Σ z_im·c − σ·z_re·s."""
    def build() -> Tensor:
        j = torch.arange(n, dtype=torch.int64).unsqueeze(1)
        k = torch.arange(outputs, dtype=torch.int64).unsqueeze(0)
        c, s = _twiddles(n, j * k)
        sigma_s = s if forward else -s
        top = [c] if real_out else [c, -sigma_s]  # rows multiplying z_re
        bottom = [sigma_s] if real_out else [sigma_s, c]  # rows multiplying z_im
        rows = [torch.cat(top, 1)] + ([] if real_in else [torch.cat(bottom, 1)])
        return (torch.cat(rows, 0) + 0.0).contiguous()
    return routes._shape_constant(("fft_direct", n, outputs, forward, real_in, real_out), device, build)


def _step_twiddles(n: int, n1: int, n2: int, forward: bool, device: torch.device) -> Tuple[Tensor, Tensor]:
    """The four-step transform's middle factors w^{j₁k₂} as (re, im) [n₁, n₂] float32 tensors."""
    def build() -> Tensor:
        j1 = torch.arange(n1, dtype=torch.int64).unsqueeze(1)
        k2 = torch.arange(n2, dtype=torch.int64).unsqueeze(0)
        c, s = _twiddles(n, j1 * k2)
        return torch.stack([c, (-s if forward else s) + 0.0])
    both = routes._shape_constant(("fft_step", n, n1, forward), device, build)
    return both[0], both[1]


# ---- one dimension ------------------------------------------------------------------------------------------

def _dft_rows(re: Tensor, im: Optional[Tensor], forward: bool, outputs: int,
              real_out: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """The DFT of each row of re (+ i·im; im None for a real signal) of length n = re.shape[-1], rows 2-d
    [R, n] float32 contiguous: (y_re, y_im) [R, outputs] (y_im None when real_out)."""
    n = re.shape[-1]
    if direct_length(n):
        rows = re if im is None else aten.cat([re, im], 1)
        w = _direct_matrix(n, outputs, forward, im is None, real_out, re.device)
        y = carbon_ops.mm(rows, w, None)
        return (y, None) if real_out else (y[:, :outputs], y[:, outputs:])
    yr, yi = _four_step(re, im, forward)
    return (yr[:, :outputs], None) if real_out else (yr[:, :outputs], yi[:, :outputs])


def _four_step(re: Tensor, im: Optional[Tensor], forward: bool) -> Tuple[Tensor, Tensor]:
    rows, n = re.shape
    n1 = split_length(n)
    n2 = n // n1

    def columns(t: Tensor) -> Tensor:  # z[j₁ + n₁·j₂] as rows (r, j₁) of length n₂
        return aten.transpose(t.reshape([rows, n2, n1]), 1, 2).reshape([rows * n1, n2]).contiguous()
    ar, ai = _dft_rows(columns(re), None if im is None else columns(im), forward, n2)
    wr, wi = _step_twiddles(n, n1, n2, forward, re.device)
    ar, ai = ar.reshape([rows, n1, n2]), ai.reshape([rows, n1, n2])
    br = aten.sub(aten.mul(ar, wr), aten.mul(ai, wi))
    bi = aten.add(aten.mul(ar, wi), aten.mul(ai, wr))

    def by_k2(t: Tensor) -> Tensor:  # B[j₁, k₂] as rows (r, k₂) of length n₁
        return aten.transpose(t, 1, 2).reshape([rows * n2, n1]).contiguous()
    xr, xi = _dft_rows(by_k2(br), by_k2(bi), forward, n1)

    def ordered(t: Tensor) -> Tensor:  # X[k₂ + n₂·k₁]: k₁ major
        return aten.transpose(t.reshape([rows, n2, n1]), 1, 2).reshape([rows, n]).contiguous()
    return ordered(xr), ordered(xi)


def _along(t: Tensor, d: int) -> Tuple[Tensor, List[int]]:
    """t with dimension d last, flattened to rows [R, n] (contiguous), and the moved shape to restore it."""
    moved = aten.movedim(t, d, -1)
    shape = list(moved.shape)
    return moved.reshape([-1, shape[-1]]).contiguous(), shape


def _restore(rows: Tensor, shape: List[int], d: int) -> Tensor:
    return aten.movedim(rows.reshape(shape[:-1] + [rows.shape[-1]]), -1, d)


def _c2c_dim(re: Tensor, im: Tensor, d: int, forward: bool) -> Tuple[Tensor, Tensor]:
    r, shape = _along(re, d)
    i, _ = _along(im, d)
    yr, yi = _dft_rows(r, i, forward, r.shape[-1])
    return _restore(yr, shape, d), _restore(yi, shape, d)


# ---- the aten ops -------------------------------------------------------------------------------------------

def _normalized(re: Tensor, im: Optional[Tensor], normalization: int, n: int) -> Tuple[Tensor, Optional[Tensor]]:
    """One division of each part by n (by_n) or by RN32(√n) (by_root_n)."""
    if normalization == 0:
        return re, im
    if normalization == 2:
        divisor = routes._scalar_like(re, float(n))
    else:
        divisor = routes.sqrt_rn(torch.full((), float(n), dtype=torch.float32)).to(re.device)
    return aten.div(re, divisor), (None if im is None else aten.div(im, divisor))


def _dims(x: Tensor, dim: List[int]) -> List[int]:
    return [d % x.dim() for d in dim]


def _arguments_ok(x: Tensor, dim: List[int], normalization: Any, complex_in: bool) -> bool:
    """False for the arguments torch itself rejects (its own error then runs); NotCovered for the dtypes and
    lengths carbon does not compute."""
    if normalization not in _NORMALIZATIONS or not dim or x.is_complex() != complex_in:
        return False
    if any(not -x.dim() <= d < x.dim() for d in dim) or len(set(_dims(x, dim))) != len(dim):
        return False
    if x.dtype not in ((torch.complex64,) if complex_in else (torch.float32,)):
        if x.is_floating_point() or x.is_complex():
            raise routes.NotCovered(f"an FFT of a {x.dtype} tensor: carbon transforms float32 and complex64")
        return False
    if any(x.shape[d] < 1 for d in _dims(x, dim)):
        return False  # torch's "Invalid number of data points" error
    for d in _dims(x, dim):
        _check_length(x.shape[d])
    return True


def fft_c2c(a: dict) -> Any:
    """_fft_c2c(self, dim, normalization, forward): the complex transform along each listed dimension in order."""
    x, dim, norm, forward = a["self"], list(a["dim"]), a["normalization"], bool(a["forward"])
    if not _arguments_ok(x, dim, norm, complex_in=True):
        return routes.PASS
    re, im = parts(x)
    for d in _dims(x, dim):
        re, im = _c2c_dim(re, im, d, forward)
    re, im = _normalized(re, im, norm, math.prod(x.shape[d] for d in _dims(x, dim)))
    return from_parts(re, im)


def fft_r2c(a: dict) -> Any:
    """_fft_r2c(self, dim, normalization, onesided): the real transform along the last listed dimension (its
    first n//2 + 1 outputs when onesided), then the forward complex transform along the others in order."""
    x, dim, norm, onesided = a["self"], list(a["dim"]), a["normalization"], bool(a["onesided"])
    if not _arguments_ok(x, dim, norm, complex_in=False):
        return routes.PASS
    dims = _dims(x, dim)
    last = dims[-1]
    rows, shape = _along(x, last)
    n = rows.shape[-1]
    yr, yi = _dft_rows(rows, None, True, n // 2 + 1 if onesided else n)
    re, im = _restore(yr, shape, last), _restore(yi, shape, last)
    for d in dims[:-1]:
        re, im = _c2c_dim(re, im, d, True)
    re, im = _normalized(re, im, norm, math.prod(x.shape[d] for d in dims))
    return from_parts(re, im)


def _hermitian_full(re: Tensor, im: Tensor, n: int) -> Tuple[Tensor, Tensor]:
    """The full length-n spectrum [R, n] from its first n//2 + 1 entries [R, n//2 + 1]: Y[n−k] = conj(Y[k]); the
    imaginary parts of Y[0] and (n even) Y[n/2] are read as +0, as torch's transforms ignore them."""
    half = n // 2 + 1
    keep = torch.ones(half, dtype=torch.bool)
    keep[0] = False
    if n % 2 == 0:
        keep[-1] = False
    im = aten.where(keep.to(im.device), im, 0.0)
    mirror = list(range((n + 1) // 2 - 1, 0, -1))  # k = ⌈n/2⌉−1 … 1 gives Y[n−k]
    index = torch.tensor(mirror, dtype=torch.int64, device=re.device)
    return (aten.cat([re, aten.index_select(re, 1, index)], 1).contiguous(),
            aten.cat([im, aten.neg(aten.index_select(im, 1, index))], 1).contiguous())


def fft_c2r(a: dict) -> Any:
    """_fft_c2r(self, dim, normalization, last_dim_size): the inverse complex transform along the listed
    dimensions but the last, then the real signal of length last_dim_size from the last one's n//2 + 1 entries
    (the real part of the inverse transform of the Hermitian spectrum, _hermitian_full)."""
    x, dim, norm, n = a["self"], list(a["dim"]), a["normalization"], int(a["last_dim_size"])
    if not _arguments_ok(x, dim, norm, complex_in=True) or n < 1:
        return routes.PASS
    dims = _dims(x, dim)
    last = dims[-1]
    if x.shape[last] != n // 2 + 1:
        raise routes.NotCovered(f"_fft_c2r with {x.shape[last]} entries for an output of length {n}")
    _check_length(n)
    re, im = parts(x)
    for d in dims[:-1]:
        re, im = _c2c_dim(re, im, d, False)
    r, shape = _along(re, last)
    i, _ = _along(im, last)
    y, _ = _dft_rows(*_hermitian_full(r, i, n), False, n, real_out=True)
    out, _ = _normalized(_restore(y, shape, last), None, norm,
                         math.prod(x.shape[d] for d in dims[:-1]) * n)
    return out.contiguous()


# ---- windows (torch.stft / istft's window argument) -----------------------------------------------------------

def _window_setup(name: str, a: dict) -> Any:
    """(positions 0 … N−1 in the window's dtype, N, L, periodic) with N = L + 1 for a periodic window, or a
    finished tensor for L ≤ 1, or PASS for torch's own errors."""
    length, periodic = a["window_length"], bool(a.get("periodic", True))
    dtype = a.get("dtype") or torch.get_default_dtype()
    device = torch.device(a.get("device") or "cpu")
    if length < 0 or a.get("layout") not in (None, torch.strided) or not dtype.is_floating_point:
        return routes.PASS
    if dtype not in (torch.float32, torch.float64):
        raise routes.NotCovered(f"{name} in {dtype}: carbon computes float32 and float64 windows")
    if length <= 1:
        return aten.ones([length], dtype=dtype, device=device)
    n = length + 1 if periodic else length
    return aten.arange(n, dtype=dtype, device=device), n, length


def _hamming(name: str, alpha: float, beta: float) -> Any:
    """torch's sequence with carbon's cos: x = RN(i·RN(2π/(N−1))), w = RN(RN(COS(x)·RN(−β)) + RN(α)) (the
    constants in binary64, then in the window's dtype), the first L of N."""
    def handler(a: dict) -> Any:
        setup = _window_setup(name, a)
        if not isinstance(setup, tuple):
            return setup
        x, n, length = setup
        alpha_, beta_ = float(a.get("alpha", alpha)), float(a.get("beta", beta))
        c = carbon_ops.cos(aten.mul(x, math.pi * 2.0 / (n - 1)))
        return aten.add(aten.mul(c, -beta_), alpha_)[:length].contiguous()
    return handler


def _blackman(a: dict) -> Any:
    """x = RN(i·RN(π/(N−1))), w = RN(RN(RN(COS(RN(4x))·0.08) − RN(COS(RN(2x))·0.5)) + 0.42) (torch's order)."""
    setup = _window_setup("blackman_window", a)
    if not isinstance(setup, tuple):
        return setup
    x, n, length = setup
    x = aten.mul(x, math.pi / (n - 1))
    four = aten.mul(carbon_ops.cos(aten.mul(x, 4)), 0.08)
    two = aten.mul(carbon_ops.cos(aten.mul(x, 2)), 0.5)
    return aten.add(aten.sub(four, two), 0.42)[:length].contiguous()


def _bartlett(a: dict) -> Any:
    """x = RN(i·RN(2/(N−1))), and RN(2 − x) from index (N−1)//2 + 1 on (torch's sequence; no transcendental)."""
    setup = _window_setup("bartlett_window", a)
    if not isinstance(setup, tuple):
        return setup
    x, n, length = setup
    x = aten.mul(x, 2.0 / (n - 1))
    first = ((n - 1) >> 1) + 1
    x = aten.cat([x[:first], aten.add(aten.neg(x[first:]), 2)])
    return x[:length].contiguous()


WINDOWS = {"hann_window": _hamming("hann_window", 0.5, 0.5), "hamming_window": _hamming("hamming_window", 0.54, 0.46),
           "blackman_window": _blackman, "bartlett_window": _bartlett}
