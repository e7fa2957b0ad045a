"""The float32 EXP on the CPU (exp_f32_core, csrc/elementwise/elementwise_math.h)
against an independent reference, on a strided subset of all 2^32 float32
bit patterns plus the thresholds.

scripts/exp_f32_check.py proves RN32(exp_f32_core(d)) == RN32(exp_core(d))
for every pattern; this CI-sized test guards the same property through the
ops that use it: carbon.exp on float32, and p_j = EXP(y_j) inside
log_softmax's backward (grad one-hot at an extra entry: G = 1, so
dx_j = RN32(0 - p_j * 1) = -p_j exactly).

Reference (never imports carbon's math): torch's float64 exp (error below a
few double ulps) widened by 2^-49 relative on both sides; where both ends
round to the same float32, that is RN32(exp(x)). The few inputs it cannot
decide (exp(x) near a float32 midpoint, e.g. x = -2^-25) go to mpmath at 256
bits and exact rational rounding.
"""

from __future__ import annotations

import struct
from fractions import Fraction

import mpmath as mp
import torch

import carbon
from oracle import as_bits, round_bits

STRIDE = 4099  # prime: the strided patterns cover every exponent and sign, and varied low bits


def f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


# Thresholds of float32 exp: the clamps of exp_f32_core (-104, 89), underflow
# to 0 and to the smallest subnormal, the subnormal range, overflow, the
# structural midpoints near 0 (exp(-2^-25) = 1 - 2^-25 + 2^-51), and the
# hardest case of the exhaustive accuracy run (docs/elementwise.md).
EDGES = [-104.0, -103.97208, -103.279, -87.33654, -87.0, 88.72283935546875, 89.0, 0.0, 2.0**-24, 2.0**-25,
         2.0**-26, -(2.0**-24), -(2.0**-25), -(2.0**-26), 1.0, -1.0, 0.34657359, -0.34657359]


# Arguments in [-87, 0] that the softmax kernels' cheaper exp leaves undecided
# (exp_f32_approx near a float32 rounding boundary, csrc/softmax/
# softmax_exp_cpu.h): every 355th of the 17,040 such patterns, so that
# log_softmax's backward takes its exp32 fallback on them.
UNDECIDED = [
    0xB2FFFC01, 0xB2FFFD64, 0xB2FFFEC7, 0xB300002A, 0xB300018D, 0xB3BFFFF0, 0xB41FFFD3, 0xB4600037, 0xB4CFFFDB,
    0xB518001E, 0xB5780006, 0xB5D3FFFC, 0xB62A000B, 0xB6810014, 0xB6DB002D, 0xB733803E, 0xB78C404C, 0xB7E4C0CD,
    0xB83DA119, 0xB8969162, 0xB8F1338D, 0xB94A8D02, 0xB99E321C, 0xB9F3CA82, 0xBA4975D0, 0xBAA92CF0, 0xBB0441A4,
    0xBB63CFBF, 0xBBBD0A94, 0xBC125429, 0xBC69E02D, 0xBCBC22A6, 0xBD10322D, 0xBD6A60B8, 0xBDC48E49, 0xBE1ABB96,
    0xBE75361B, 0xBED5AB26, 0xBF294118, 0xBF7FD873, 0xBFDBA921, 0xC03359CB, 0xC0949CD5, 0xC0EB1B7C, 0xC145BFCE,
    0xC1A526CE, 0xC1FBE702, 0xC258D1C9,
]

# Likewise for the AVX-512 kernels' table-driven exp (exp16_table_round,
# csrc/softmax/softmax_exp_avx512.h): every 10th of the 519 patterns in
# [-87, 0] it leaves undecided.
UNDECIDED_TABLE = [
    0xB2FFFFE1, 0xB2FFFFEB, 0xB2FFFFF5, 0xB2FFFFFF, 0xB3000009, 0xB3BFFFFB, 0xB3C00005, 0xB4200003, 0xB4900000,
    0xB4D00003, 0xB5280003, 0xB5780007, 0xB5C40009, 0xB616000B, 0xB65E0018, 0xB6BD0023, 0xB7368041, 0xB79CC060,
    0xB7F4C0EA, 0xB85B6178, 0xB8C85273, 0xB928AB79, 0xB98D98E5, 0xB9F2925D, 0xBA2DD8C1, 0xBA7242A6, 0xBAD65DDA,
    0xBB25D42A, 0xBB8D98F5, 0xBBABC34B, 0xBBDECE3A, 0xBC6A5085, 0xBCB8F40F, 0xBD1CF55A, 0xBD816CC3, 0xBDBD1D4A,
    0xBE197D60, 0xBE532F8C, 0xBEA6154C, 0xBEE0E6CD, 0xBF167399, 0xBF76FD92, 0xBFB251F0, 0xC00498A0, 0xC03C6E62,
    0xC09FEB7D, 0xC0E42C68, 0xC11402A6, 0xC168F2E2, 0xC1A5F00F, 0xC203DD5E, 0xC26B5715,
]


def patterns() -> torch.Tensor:
    bits = set(range(0, 1 << 32, STRIDE)) | set(UNDECIDED) | set(UNDECIDED_TABLE)
    for v in EDGES:
        b = f32_bits(v)
        bits.update(range(max(b - 16, 0), min(b + 17, 1 << 32)))
    bits.update({0xC16912CD, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x00000001, 0x80000001})
    signed = [b - (1 << 32) if b >= 1 << 31 else b for b in sorted(bits)]
    return torch.tensor(signed, dtype=torch.int32).view(torch.float32)


def reference_bits(x: torch.Tensor) -> torch.Tensor:
    """RN32(exp(x)) as int32 bits for a float32 tensor x (NaN -> canonical NaN)."""
    x64 = x.to(torch.float64)
    v = torch.exp(x64)
    lo = (v * (1 - 2.0**-49)).to(torch.float32)
    hi = (v * (1 + 2.0**-49)).to(torch.float32)
    out = as_bits(hi).clone()
    undecided = (as_bits(lo) != as_bits(hi)).nonzero().flatten().tolist()
    mp.mp.prec = 256
    for i in undecided:
        e = mp.exp(mp.mpf(float(x64[i])))
        sign, man, exp, _ = e._mpf_
        out[i] = _signed32(round_bits(Fraction(int(man)) * Fraction(2) ** int(exp), torch.float32))
    out[torch.isnan(x)] = _signed32(0x7FC00000)
    return out


def _signed32(b: int) -> int:
    return b - (1 << 32) if b >= 1 << 31 else b


def _assert_same(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, what: str) -> None:
    bad = (got != want).nonzero().flatten()
    if bad.numel():
        i = bad[:5].tolist()
        raise AssertionError(f"{what}: {bad.numel()} of {x.numel()} differ, e.g. x = {x[i].tolist()} "
                             f"got {[hex(b & 0xFFFFFFFF) for b in got[i].tolist()]} "
                             f"want {[hex(b & 0xFFFFFFFF) for b in want[i].tolist()]}")


def test_reference_decides_most_inputs():
    # The float64 reference must be a real check, not an mpmath run in disguise.
    x = patterns()
    v = torch.exp(x.to(torch.float64))
    lo, hi = (v * (1 - 2.0**-49)).to(torch.float32), (v * (1 + 2.0**-49)).to(torch.float32)
    assert (as_bits(lo) != as_bits(hi)).sum().item() < 100


def test_exp_float32_strided_patterns():
    x = patterns()
    _assert_same(as_bits(carbon.exp(x)), reference_bits(x), x, "carbon.exp float32")


def test_log_softmax_backward_exp_strided_patterns():
    x = patterns()
    n = x.numel()
    rows = 64
    per_row = (n + rows - 1) // rows
    y = torch.zeros(rows, per_row + 1, dtype=torch.float32)
    flat = torch.zeros(rows * per_row, dtype=torch.float32)
    flat[:n] = x
    y[:, :per_row] = flat.view(rows, per_row)
    g = torch.zeros_like(y)
    g[:, per_row] = 1.0  # G = RN32(sum g) = 1
    dx = torch.ops.carbon.log_softmax_backward(g, y, 1, torch.float32)
    got = as_bits(dx[:, :per_row].reshape(-1)[:n])
    want = reference_bits(x)
    # dx_j = RN32(0 - p_j) = -p_j exactly; 0 - (+0) = +0; a NaN stays the canonical NaN
    keep = torch.isnan(x) | (want == 0)
    neg = torch.where(keep, want, want ^ torch.tensor(-(1 << 31), dtype=torch.int32))
    _assert_same(got, neg, x, "log_softmax backward p_j")
