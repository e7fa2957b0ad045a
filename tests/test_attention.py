"""carbon.scaled_dot_product_attention against its definition (contract §9),
composed from independent references: the integer bmm oracle
(tests/oracle.py), the softmax reference (tests/softmax_reference.py), the
logits step written here with numpy float64 operations and, for dropout_p >
0, the keep-mask of contract §10 built from tests/philox_reference.py's
Philox (not carbon's generator)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import carbon
import philox_reference
from oracle import assert_bits_equal, as_bits, bmm_bits, bits_tensor, fmt_of, sum_to_shape_bits
from softmax_reference import softmax_backward_bits, softmax_bits

from data import generator


def _from_bits(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return bits.view(dtype)


def _logits(s: torch.Tensor, scale: float, mask, causal: bool) -> torch.Tensor:
    """z = RN32((s (*) scale) (+) m), -inf above the diagonal when causal:
    fp64 operations in numpy, one float32 rounding (numpy's cast rounds to
    nearest even)."""
    z = s.double().numpy() * scale
    if mask is not None:
        z = z + mask.double().numpy()
    z = torch.from_numpy(z.astype(np.float32))
    if causal:
        L, S = z.shape[-2:]
        z = z.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), -math.inf)
    return z


def _dropout_reference(p: torch.Tensor, dropout_p: float, seed: int, offset: int) -> torch.Tensor:
    """Contract §10's dropout of a float32 tensor at the draw (seed, offset)
    (tests/philox_reference.py), as a tensor."""
    bits = philox_reference.dropout_bits(p, dropout_p, seed, offset)
    return _from_bits(bits_tensor(bits, torch.float32).reshape(p.shape), torch.float32)


def reference_attention(q, k, v, mask=None, causal=False, scale=None, dropout=None):
    """Forward of contract §9, plus the intermediate tensors. dropout =
    (dropout_p, seed, offset): the draw the op is expected to take."""
    lead, (L, E), S = q.shape[:-2], q.shape[-2:], k.shape[-2]
    B = math.prod(lead)
    q3, k3, v3 = q.reshape(B, L, E), k.reshape(B, S, E), v.reshape(B, S, -1)
    sigma = 1.0 / math.sqrt(E) if scale is None else scale
    s = _from_bits(bmm_bits(q3, k3.transpose(1, 2), out_dtype=torch.float32), torch.float32)
    m = None
    if mask is not None:
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape).masked_fill(~mask, -math.inf)
        m = mask.expand(lead + (L, S)).reshape(B, L, S)
    z = _logits(s, sigma, m, causal)
    p = _from_bits(softmax_bits(z, -1), torch.float32)
    pd = p if dropout is None else _dropout_reference(p, *dropout)
    o = _from_bits(bmm_bits(pd, v3, out_dtype=q.dtype), q.dtype)
    return o.reshape(lead + (L, v.shape[-1])), (q3, k3, v3, p, sigma, pd)


def reference_grads(q, k, v, grad_out, causal=False, mask=None, scale=None, dropout=None, with_dz=False):
    """Gradients by the chain rule through the same ops, each step's gradient
    from its own reference (bmm oracle, softmax backward reference, dropout
    backward = the same keep-mask and scaling applied to the gradient). With
    with_dz, also dz, the logits' gradient [B, L, S] (a float mask's before
    the sum over its broadcast dimensions)."""
    o, (q3, k3, v3, p, sigma, pd) = reference_attention(q, k, v, mask=mask, causal=causal, scale=scale,
                                                         dropout=dropout)
    B, L = q3.shape[:2]
    g3 = grad_out.reshape(B, L, -1)
    dp = _from_bits(bmm_bits(g3, v3.transpose(1, 2), out_dtype=torch.float32), torch.float32)
    if dropout is not None:
        dp = _dropout_reference(dp, *dropout)
    dv = _from_bits(bmm_bits(pd.transpose(1, 2), g3, out_dtype=v.dtype), v.dtype)
    dz = _from_bits(softmax_backward_bits(dp, p, -1, torch.float32), torch.float32)
    ds = _logits(dz, sigma, None, False)
    dq = _from_bits(bmm_bits(ds, k3, out_dtype=q.dtype), q.dtype)
    dk = _from_bits(bmm_bits(ds.transpose(1, 2), q3, out_dtype=k.dtype), k.dtype)
    grads = dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
    return grads + (dz,) if with_dz else grads


def _qkv(shape, dtype=torch.float32, seed=0, kv_len=None):
    g = generator(seed)
    *lead, L, E = shape
    S = kv_len or L
    q = torch.randn(*lead, L, E, generator=g).to(dtype)
    k = torch.randn(*lead, S, E, generator=g).to(dtype)
    v = torch.randn(*lead, S, E, generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_forward_matches_definition(causal, dtype):
    q, k, v = _qkv((2, 2, 6, 4), dtype)
    out = carbon.scaled_dot_product_attention(q, k, v, is_causal=causal)
    expected, _ = reference_attention(q, k, v, causal=causal)
    assert_bits_equal(out, as_bits(expected), f"attention causal={causal}", dtype=dtype)


def test_forward_with_masks_and_scale():
    q, k, v = _qkv((1, 2, 5, 3), kv_len=7)
    g = generator(3)
    bool_mask = torch.rand(5, 7, generator=g) > 0.4
    bool_mask[2] = False  # a fully masked row gives zeros
    add_mask = torch.randn(2, 5, 7, generator=g)
    for mask in (bool_mask, add_mask):
        out = carbon.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        expected, _ = reference_attention(q, k, v, mask=mask, scale=0.3)
        assert_bits_equal(out, as_bits(expected), f"mask {mask.dtype}")
    out = carbon.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask)
    assert torch.equal(out[0, :, 2], torch.zeros_like(out[0, :, 2]))


def test_causal_with_longer_keys_is_top_left_aligned():
    q, k, v = _qkv((1, 1, 3, 4), kv_len=5)
    out = carbon.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected, _ = reference_attention(q, k, v, causal=True)
    assert_bits_equal(out, as_bits(expected), "causal L < S")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_match_definition(dtype):
    q, k, v = _qkv((1, 2, 5, 3), dtype, seed=7)
    grad_out = torch.randn(1, 2, 5, 3, generator=generator(8)).to(dtype)
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    out = carbon.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    got = torch.autograd.grad(out, (qs, ks, vs), grad_out)
    for name, g, e in zip("qkv", got, reference_grads(q, k, v, grad_out, causal=True)):
        assert_bits_equal(g, as_bits(e), f"d{name}", dtype=dtype)


def test_learned_mask_gradient_is_the_exact_sum_of_the_logit_gradients():
    """A float attn_mask broadcast over batch and heads (T5's position bias) gets dz, the logits'
    gradient, summed exactly over the broadcast dimensions with one rounding."""
    from oracle import row_quotient_bits, bits_tensor

    q, k, v = _qkv((2, 2, 5, 3), seed=9)
    mask = torch.randn(5, 5, generator=generator(10))
    grad_out = torch.randn(2, 2, 5, 3, generator=generator(11))
    leaf = mask.clone().requires_grad_()
    out = carbon.scaled_dot_product_attention(q, k, v, attn_mask=leaf)
    out.backward(grad_out)
    _, (q3, k3, v3, p, sigma, _) = reference_attention(q, k, v, mask=mask)
    dp = _from_bits(bmm_bits(grad_out.reshape(4, 5, 3), v3.transpose(1, 2), out_dtype=torch.float32), torch.float32)
    dz = _from_bits(softmax_backward_bits(dp, p, -1, torch.float32), torch.float32).double().tolist()
    want = [row_quotient_bits([dz[b][i][j] for b in range(4)], 1, torch.float32) for i in range(5) for j in range(5)]
    assert_bits_equal(leaf.grad, bits_tensor(want, torch.float32).reshape(5, 5), "mask gradient")


def _mask(kind, dtype, seed):
    """A mask for q [2, 2, 5, E] and k [2, 2, 7, E]: boolean [5, 7] (True = attend) with row 1 fully masked, or
    additive [2, 1, 5, 7] in `dtype` (broadcast over the heads) with one -inf entry."""
    g = generator(seed)
    if kind == "bool":
        mask = torch.rand(5, 7, generator=g) > 0.4
        mask[1] = False
        return mask
    mask = torch.randn(2, 1, 5, 7, generator=g)
    mask[0, 0, 2, 3] = -math.inf
    return mask.to(dtype)


def _attend(q, k, v, grad_out, kind, dtype, mask_seed, **kwargs):
    """carbon's output and gradients (dq, dk, dv, and dmask for a learned mask), plus the mask used."""
    mask = None if kind in ("none", "causal") else _mask("bool" if kind == "bool" else "float", dtype, mask_seed)
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    inputs, attn_mask = (qs, ks, vs), mask
    if kind == "learned":  # requires grad: the composition of ops, not the CPU's fused attention_probs
        attn_mask = mask.clone().requires_grad_()
        inputs += (attn_mask,)
    out = carbon.scaled_dot_product_attention(qs, ks, vs, attn_mask=attn_mask, is_causal=kind == "causal", **kwargs)
    return out, torch.autograd.grad(out, inputs, grad_out), mask


def _check_grads(got, want, dz, mask, kind, dtype, shape):
    for name, g, e in zip("qkv", got, want):
        assert_bits_equal(g, as_bits(e), f"d{name}", dtype=dtype)
    if kind == "learned":
        # the logits' gradient summed exactly over the dimensions the mask was broadcast along (the heads), one
        # rounding to the mask's dtype (contract §9)
        want_mask = sum_to_shape_bits(dz.reshape(shape), mask.shape, mask.dtype)
        assert_bits_equal(got[3], want_mask, "dmask", dtype=mask.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["none", "bool", "float", "learned"])
def test_gradients_non_causal_and_masked_match_definition(kind, dtype):
    """Gradients against the definition without is_causal: unmasked, a boolean mask (with a fully masked row), an
    additive mask broadcast over the heads, and that mask requiring grad (a learned bias), whose own gradient is
    checked too."""
    q, k, v = _qkv((2, 2, 5, 3), dtype, seed=12, kv_len=7)
    grad_out = torch.randn(2, 2, 5, 3, generator=generator(13)).to(dtype)
    out, got, mask = _attend(q, k, v, grad_out, kind, dtype, mask_seed=14)
    expected, _ = reference_attention(q, k, v, mask=mask)
    assert_bits_equal(out, as_bits(expected), "forward", dtype=dtype)
    *want, dz = reference_grads(q, k, v, grad_out, mask=mask, with_dz=True)
    _check_grads(got, want, dz, mask, kind, dtype, (2, 2, 5, 7))


@pytest.fixture
def default_generator():
    """carbon.default_generator, its state put back after the test."""
    state = carbon.default_generator.get_state()
    yield carbon.default_generator
    carbon.default_generator.set_state(state)


@pytest.mark.parametrize("kind,dtype,dropout_p", [
    ("none", torch.float32, 0.3), ("causal", torch.float32, 0.3), ("bool", torch.float32, 0.3),
    ("learned", torch.float32, 0.3), ("none", torch.bfloat16, 0.3), ("causal", torch.bfloat16, 0.6),
    ("none", torch.float32, 1.0),
])
def test_dropout_matches_definition(kind, dtype, dropout_p, default_generator):
    """dropout_p > 0 (contract §9, §10): one draw of carbon.default_generator at its (seed, offset); the keep-mask
    of p [B, L, S] built here from the independent Philox of tests/philox_reference.py, kept p rounded once from
    p / (1 - dropout_p), dropped +0; forward and gradients (the backward regenerates the same mask and takes no
    draw) against the definition."""
    seed, offset = 2**63 + 977, 5
    q, k, v = _qkv((2, 2, 5, 3), dtype, seed=15, kv_len=7)
    grad_out = torch.randn(2, 2, 5, 3, generator=generator(16)).to(dtype)
    default_generator.manual_seed(seed)
    default_generator.offset = offset
    out, got, mask = _attend(q, k, v, grad_out, kind, dtype, mask_seed=17, dropout_p=dropout_p)
    assert default_generator.offset == offset + 1, "one draw, forward and backward together"
    draw = (dropout_p, seed, offset)
    expected, (*_, p, _, pd) = reference_attention(q, k, v, mask=mask, causal=kind == "causal", dropout=draw)
    dropped = int(((p != 0) & (pd == 0)).sum())
    assert dropped > 0 and (dropout_p == 1.0 or int((pd != 0).sum()) > 0), "the data must drop some and keep some"
    assert_bits_equal(out, as_bits(expected), "forward", dtype=dtype)
    *want, dz = reference_grads(q, k, v, grad_out, mask=mask, causal=kind == "causal", dropout=draw, with_dz=True)
    _check_grads(got, want, dz, mask, kind, dtype, (2, 2, 5, 7))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("L,S", [(11, 11), (9, 13), (13, 6), (70, 70), (65, 130), (130, 64)])
def test_causal_scores_lower_blocks(dtype, L, S):
    # On the CPU the causal scores come from torch.ops.carbon.attention_probs,
    # which computes only the GEMM blocks of 64 x 64 scores holding an entry
    # j <= i and rounds only those entries, then takes rows of logits to the
    # softmax 16 at a time: lengths across the block sizes, with more and
    # fewer keys than queries, forward and gradients against the definition.
    q, k, v = _qkv((2, 1, L, 3), dtype, seed=9, kv_len=S)
    grad_out = torch.randn(2, 1, L, 3, generator=generator(10)).to(dtype)
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    out = carbon.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    expected, _ = reference_attention(q, k, v, causal=True)
    assert_bits_equal(out, as_bits(expected), "forward", dtype=dtype)
    got = torch.autograd.grad(out, (qs, ks, vs), grad_out)
    for name, g, e in zip("qkv", got, reference_grads(q, k, v, grad_out, causal=True)):
        assert_bits_equal(g, as_bits(e), f"d{name}", dtype=dtype)


def test_fused_probs_opcheck():
    g = generator(3)
    q, k = torch.randn(2, 5, 4, generator=g), torch.randn(2, 6, 4, generator=g)
    mask = torch.randn(5, 6, generator=g).expand(2, 5, 6)
    torch.library.opcheck(torch.ops.carbon.attention_probs.default, (q, k, 0.5, mask, False))
    torch.library.opcheck(torch.ops.carbon.attention_probs.default, (q, k, 0.5, None, True))
    probs = torch.ops.carbon.attention_probs(q, k, 0.5, None, True)
    grad = torch.randn(2, 5, 6, generator=g)
    torch.library.opcheck(torch.ops.carbon.attention_probs_backward.default, (grad, probs, 0.5))


def test_batch_and_thread_invariance():
    q, k, v = _qkv((6, 3, 33, 16), seed=11)
    full = carbon.scaled_dot_product_attention(q, k, v, is_causal=True)
    alone = carbon.scaled_dot_product_attention(q[2:3], k[2:3], v[2:3], is_causal=True)
    assert torch.equal(as_bits(full[2:3]), as_bits(alone))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = carbon.scaled_dot_product_attention(q, k, v, is_causal=True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(as_bits(full), as_bits(one))


def test_close_to_torch():
    q, k, v = _qkv((2, 4, 40, 16), seed=5)
    out = carbon.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)


def test_attention_logits_nan_results_are_the_canonical_nan():
    """Every NaN logit is 0x7FC00000 (contract §1): a NaN score of either
    sign, a NaN mask, and +inf score plus -inf mask (x86 gives the last a
    negative NaN); infinities and numbers are unchanged. Rows long enough
    for the vector loops (and their fallback) and a short one."""
    nan_bits = 0x7FC00000
    for n in (4, 37):
        scores = [float("nan"), -float("nan"), float("inf"), 1.0] * n
        masks = [0.0, 0.0, -float("inf"), float("nan")] * n
        s = torch.tensor(scores, dtype=torch.float32).view(1, 1, -1)
        m = torch.tensor(masks, dtype=torch.float32).view(1, 1, -1)
        for mask, want in ((None, [nan_bits, nan_bits, 0x7F800000, 0x3F000000]),
                           (m, [nan_bits, nan_bits, nan_bits, nan_bits])):
            out = torch.ops.carbon.attention_logits(s, 0.5, mask, False)
            got = (out.view(torch.int32).flatten().long() & 0xFFFFFFFF).tolist()
            assert got == want * n, (n, mask is None, [hex(v) for v in got[:4]])


def test_attention_logits_opcheck():
    g = generator(2)
    s = torch.randn(2, 4, 5, generator=g)
    mask = torch.randn(4, 5, generator=g).expand(2, 4, 5)
    torch.library.opcheck(torch.ops.carbon.attention_logits.default, (s.requires_grad_(), 0.25, mask, True))
    torch.library.opcheck(torch.ops.carbon.attention_logits.default, (s.detach(), 0.5, None, False))


def test_compiles_fullgraph():
    q, k, v = _qkv((1, 2, 8, 4), seed=4)
    fn = torch.compile(lambda a, b, c: carbon.scaled_dot_product_attention(a, b, c, is_causal=True), fullgraph=True)
    assert torch.equal(as_bits(fn(q, k, v)), as_bits(carbon.scaled_dot_product_attention(q, k, v, is_causal=True)))


def test_errors():
    q, k, v = _qkv((1, 2, 4, 3))
    sdpa = carbon.scaled_dot_product_attention
    with pytest.raises(ValueError, match="dropout_p"):
        sdpa(q, k, v, dropout_p=1.5)
    with pytest.raises(ValueError, match="not both"):
        sdpa(q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.bool), is_causal=True)
    with pytest.raises(ValueError, match="shapes do not match"):
        sdpa(q, k[..., :2], v)
    with pytest.raises(ValueError, match="leading dimensions"):
        sdpa(q, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="does not broadcast"):
        sdpa(q, k, v, attn_mask=torch.zeros(3, 4))
    # a mask on another device than query raises (contract §9), it is not copied over; "meta" stands in for a
    # second device here (tests/test_attention_cuda.py checks CPU against CUDA)
    for mask in (torch.ones(4, 4, dtype=torch.bool), torch.zeros(2, 4, 4)):
        with pytest.raises(ValueError, match=r"^carbon\.scaled_dot_product_attention: .*attn_mask is on meta"):
            sdpa(q, k, v, attn_mask=mask.to("meta"))
        with pytest.raises(ValueError, match=r"attn_mask is on cpu and query is on meta"):
            sdpa(q.to("meta"), k.to("meta"), v.to("meta"), attn_mask=mask)
    with pytest.raises(ValueError, match="one device"):
        sdpa(q, k.to("meta"), v)
    with pytest.raises(TypeError, match="float64"):
        sdpa(q.double(), k.double(), v.double())
    with pytest.raises(TypeError, match="float32"):
        torch.ops.carbon.attention_logits(torch.zeros(1, 2, 2, dtype=torch.float16), 1.0, None, False)
    with pytest.raises(ValueError, match="mask has shape"):
        torch.ops.carbon.attention_logits(torch.zeros(1, 2, 2), 1.0, torch.zeros(1, 2, 3), False)


def test_meta_shapes():
    q, k, v = (t.to("meta") for t in _qkv((2, 3, 5, 4), kv_len=6))
    assert carbon.scaled_dot_product_attention(q, k, v).shape == (2, 3, 5, 4)
