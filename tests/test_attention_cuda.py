"""On a CUDA GPU carbon.scaled_dot_product_attention and its attention_logits
step return the same bits as on the CPU, forward and backward (contract §9
defines them exactly). Skipped without a GPU."""

import math

import pytest
import torch

import carbon
from data import generator
from oracle import as_bits

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _qkv(shape, dtype, seed, kv_len=None):
    g = generator(seed)
    *lead, L, E = shape
    S = kv_len or L
    return tuple(torch.randn(*lead, n, E, generator=g).to(dtype) for n in (L, S, S))


def _same(gpu, cpu, context):
    assert gpu.device.type == "cuda", context
    assert torch.equal(as_bits(gpu), as_bits(cpu)), context


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_match_cpu(dtype, causal):
    q, k, v = _qkv((2, 3, 37, 16), dtype, seed=1)
    grad = torch.randn(2, 3, 37, 16, generator=generator(2)).to(dtype)
    results = {}
    for device in ("cpu", "cuda"):
        qs, ks, vs = (t.to(device).requires_grad_() for t in (q, k, v))
        out = carbon.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        results[device] = (out, *torch.autograd.grad(out, (qs, ks, vs), grad.to(device)))
    for name, gpu, cpu in zip(("out", "dq", "dk", "dv"), results["cuda"], results["cpu"]):
        _same(gpu, cpu, f"{name} {dtype} causal={causal}")


def test_masks_and_fully_masked_rows_match_cpu():
    q, k, v = _qkv((1, 2, 9, 8), torch.float32, seed=3, kv_len=11)
    bool_mask = torch.rand(9, 11, generator=generator(4)) > 0.5
    bool_mask[4] = False
    add_mask = torch.randn(2, 9, 11, generator=generator(5))
    add_mask[0, 1, 3] = -math.inf
    for mask in (bool_mask, add_mask):
        cpu = carbon.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        gpu = carbon.scaled_dot_product_attention(q.cuda(), k.cuda(), v.cuda(), attn_mask=mask.cuda(), scale=0.3)
        _same(gpu, cpu, f"mask {mask.dtype}")


def test_attention_logits_match_cpu():
    g = generator(6)
    s = torch.randn(3, 17, 19, generator=g)
    s[0, 0, 0] = -0.0
    mask = torch.randn(17, 19, generator=g).to(torch.bfloat16).expand(3, 17, 19)
    for m, causal in ((None, False), (None, True), (mask, False), (mask, True)):
        cpu = torch.ops.carbon.attention_logits(s, 0.125, m, causal)
        gpu = torch.ops.carbon.attention_logits(s.cuda(), 0.125, None if m is None else m.cuda(), causal)
        _same(gpu, cpu, f"logits mask={m is not None} causal={causal}")


def test_fused_attention_probs_ops_match_cpu():
    """attention_probs and its backward (fused on the CPU, op by op on CUDA): the same bits."""
    g = generator(8)
    q, k = torch.randn(2, 70, 16, generator=g), torch.randn(2, 75, 16, generator=g)
    grad = torch.randn(2, 70, 75, generator=g)
    mask = torch.randn(2, 70, 75, generator=g)
    for m, causal in ((None, False), (None, True), (mask, False)):
        cpu = torch.ops.carbon.attention_probs(q, k, 0.25, m, causal)
        gpu = torch.ops.carbon.attention_probs(q.cuda(), k.cuda(), 0.25, None if m is None else m.cuda(), causal)
        _same(gpu, cpu, f"probs mask={m is not None} causal={causal}")
        back_cpu = torch.ops.carbon.attention_probs_backward(grad, cpu, 0.25)
        back_gpu = torch.ops.carbon.attention_probs_backward(grad.cuda(), gpu, 0.25)
        _same(back_gpu, back_cpu, f"probs backward mask={m is not None} causal={causal}")


def test_batch_invariance_on_gpu():
    q, k, v = (t.cuda() for t in _qkv((8, 2, 33, 16), torch.float32, seed=7))
    full = carbon.scaled_dot_product_attention(q, k, v, is_causal=True)
    alone = carbon.scaled_dot_product_attention(q[5:6], k[5:6], v[5:6], is_causal=True)
    assert torch.equal(as_bits(full[5:6]), as_bits(alone))
