"""Causal attention's and the matmul's CPU implementations give the same bits: the AVX-512 kernels
(tier 1's rounding rows of the matmul, attention's logits rows, the fused widening of float32 /
bfloat16 rows, the transposing copy) against the AVX2 ones (CARBON_CPU_NO_AVX512), and the AVX2
ones against the compiled portable loops (CARBON_MATMUL_PORTABLE and CARBON_ATTENTION_PORTABLE),
each pair in two fresh processes. On a CPU without AVX2 both runs take the portable loops and the
test checks only that they are deterministic."""

from __future__ import annotations

from portable_paths import assert_portable_gives_the_same_bits, needs_avx512

SCRIPT = r'''
import sys, torch, carbon
gen = torch.Generator().manual_seed(0)
results = []
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for (B, H, L, E) in ((1, 2, 7, 8), (2, 3, 70, 16), (1, 2, 257, 64)):
        q, k, v, g = (torch.randn(B, H, L, E, generator=gen).to(dtype) for _ in range(4))
        q[0, 0, 3] = 0.0
        k[0, 1, :, 2] = -0.0
        v[0, 0, 1, 1] = float("nan")
        q[-1, -1, -1] *= 1e4 if dtype == torch.float16 else 1e30
        for causal, scale in ((True, None), (False, 0.5), (True, -3.0)):
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            out = carbon.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=scale)
            out.backward(g)
            results += [out.detach(), qq.grad, kk.grad, vv.grad]
    a = torch.randn(3, 200, 130, generator=gen).to(dtype)
    b = torch.randn(3, 130, 90, generator=gen).to(dtype)
    a[1, ::4] = 0.0
    a[1, 1::4] = -0.0
    b[2, :, 5] = 0.0
    for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
        results.append(carbon.bmm(a, b, out_dtype=out_dtype))
        results.append(carbon.baddbmm(torch.randn(90, generator=gen).to(dtype), a, b, out_dtype=out_dtype))
    # Tier 1's edges: small integers (exact GEMM values, many ties of the 16-bit outputs), products
    # that overflow the 16-bit formats or fall below float32's normal range, an operand whose rows
    # are strided (the transposing copy on both sides), rows with zero ends (the spans).
    ints = torch.randint(-20, 21, (2, 37, 45), generator=gen).to(dtype)
    ints_b = torch.randint(-20, 21, (2, 45, 29), generator=gen).to(dtype)
    big = 2.0 ** (6 if dtype == torch.float16 else 60)
    tiny = 2.0 ** (-7 if dtype == torch.float16 else -70)
    at = torch.randn(2, 45, 37, generator=gen).to(dtype).transpose(1, 2)
    ends = torch.randn(2, 37, 45, generator=gen).to(dtype)
    ends[:, :, :9] = 0.0
    ends[:, :, -5:] = -0.0
    for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
        results.append(carbon.bmm(ints, ints_b, out_dtype=out_dtype))
        results.append(carbon.bmm(ints * big, ints_b * big, out_dtype=out_dtype))
        results.append(carbon.bmm(a[:2, :37, :45] * tiny, b[:2, :45, :29] * tiny, out_dtype=out_dtype))
        results.append(carbon.bmm(at, b[:2, :45, :29], out_dtype=out_dtype))
        results.append(carbon.bmm(ends, ints_b, out_dtype=out_dtype))
    # Near-cancellations (the two halves of k cancel but for one term): tier 1's bound leaves these
    # outputs to tier 2's compensated dot product (16 lanes on AVX-512 and AVX2) and tier 3.
    u = torch.randn(2, 16, 1030, generator=gen).to(dtype)
    w = torch.randn(2, 1030, 12, generator=gen).to(dtype)
    halves_a, halves_b = torch.cat([u, u], dim=2), torch.cat([w, -w], dim=1)
    halves_b[:, 7, :] += (1e-2 * torch.randn(2, 12, generator=gen)).to(dtype)
    for out_dtype in (torch.float32, torch.bfloat16):
        results.append(carbon.bmm(halves_a, halves_b, out_dtype=out_dtype))
torch.save(results, sys.argv[1])
'''

PORTABLE = ("CARBON_MATMUL_PORTABLE", "CARBON_ATTENTION_PORTABLE")


@needs_avx512
def test_avx512_and_avx2_attention_kernels_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, ("CARBON_CPU_NO_AVX512",))


def test_avx2_and_portable_attention_kernels_give_the_same_bits(tmp_path):
    assert_portable_gives_the_same_bits(SCRIPT, tmp_path, PORTABLE, fixed=("CARBON_CPU_NO_AVX512",))
