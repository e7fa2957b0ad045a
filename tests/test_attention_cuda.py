"""On a CUDA GPU carbon.scaled_dot_product_attention and its attention_logits
step return the same bits as on the CPU, forward and backward (contract §9
defines them exactly). Skipped without a GPU."""

import math

import pytest
import torch

import carbon
from cuda_graphs import capture
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


def test_attention_logits_empty_graph_and_strided_mask():
    """attention_logits on CUDA: empty scores (no launch), a mask view with
    zero strides and an offset, and a CUDA graph replayed on new scores."""
    g = generator(9)
    for shape in ((0, 3, 4), (2, 0, 4), (2, 3, 0)):
        out = torch.ops.carbon.attention_logits(torch.empty(shape, device="cuda"), 0.5, None, True)
        assert out.shape == shape and out.device.type == "cuda"
    s = torch.randn(4, 9, 13, generator=g)
    base = torch.randn(3, 20, 30, generator=g).to(torch.float16)
    mask = base[1:2, 2:11, 5:18].expand(4, 9, 13)  # stride 0 in dim 0, a storage offset
    _same(torch.ops.carbon.attention_logits(s.cuda(), 0.3, base.cuda()[1:2, 2:11, 5:18].expand(4, 9, 13), False),
          torch.ops.carbon.attention_logits(s, 0.3, mask, False), "strided mask")
    static_s, static_m = s.cuda(), mask.cuda()
    graph, z = capture(lambda: torch.ops.carbon.attention_logits(static_s, 0.3, static_m, True))
    for _ in range(2):
        new = torch.randn(4, 9, 13, generator=g)
        static_s.copy_(new.cuda())
        graph.replay()
        torch.cuda.synchronize()
        _same(z, torch.ops.carbon.attention_logits(new, 0.3, mask, True), "graph replay")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_attention_on_a_device_that_is_not_current():
    q, k, v = _qkv((2, 2, 21, 8), torch.float32, seed=10)
    dev = torch.device("cuda", 1)
    with torch.cuda.device(0):
        cpu = carbon.scaled_dot_product_attention(q, k, v, is_causal=True)
        gpu = carbon.scaled_dot_product_attention(q.to(dev), k.to(dev), v.to(dev), is_causal=True)
        assert gpu.device == dev
        _same(gpu, cpu, "attention on cuda:1")
        s = torch.randn(2, 5, 6, generator=generator(11))
        with pytest.raises(ValueError, match="one device"):
            torch.ops.carbon.attention_logits(s.to(dev), 0.5, s.to("cuda:0"), False)


def test_tensors_on_different_devices_raise():
    """Contract §9: tensors on different devices raise ValueError, the mask included (it is not silently copied to
    query's device); a CPU and one GPU are enough."""
    q, k, v = _qkv((1, 2, 4, 8), torch.float32, seed=12)
    qc, kc, vc = q.cuda(), k.cuda(), v.cuda()
    sdpa = carbon.scaled_dot_product_attention
    for mask in (torch.rand(4, 4, generator=generator(13)) > 0.5, torch.randn(2, 4, 4, generator=generator(14))):
        with pytest.raises(ValueError, match=r"^carbon\.scaled_dot_product_attention: .*attn_mask is on cpu.*cuda"):
            sdpa(qc, kc, vc, attn_mask=mask)
        with pytest.raises(ValueError, match=r"^carbon\.scaled_dot_product_attention: .*attn_mask is on cuda"):
            sdpa(q, k, v, attn_mask=mask.cuda())
    learned = torch.randn(4, 4, requires_grad=True)
    with pytest.raises(ValueError, match="attn_mask is on cpu"):
        sdpa(qc, kc, vc, attn_mask=learned)
    one_device = r"^carbon\.scaled_dot_product_attention: expected all tensors on one device"
    for args in ((q, kc, vc), (q, kc, v), (qc, kc, v), (qc, k, vc)):
        with pytest.raises(ValueError, match=one_device):
            sdpa(*args)
    with pytest.raises(ValueError, match="one device"):
        torch.ops.carbon.attention_logits(torch.zeros(1, 4, 4, device="cuda"), 0.5, torch.zeros(1, 4, 4), False)
