"""carbon.nn.convert and carbon.nn.CausalSelfAttention.

References: torch's modules in float64 (tolerance), carbon's functional ops
composed by hand (bits), and the converted model itself at another batch size
and thread count (bits)."""

import math

import pytest
import torch
import torch.nn.functional as F

import carbon
from carbon.fingerprint import fingerprint


class MyLinear(torch.nn.Linear):
    """A user subclass: its forward may differ, so convert must leave it alone."""

    def forward(self, x):
        return super().forward(x) * 2


class Net(torch.nn.Module):
    def __init__(self, vocab=11, d=16) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.ln = torch.nn.LayerNorm(d)
        self.rms = torch.nn.RMSNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.gelu = torch.nn.GELU(approximate="tanh")
        self.fc2 = torch.nn.Linear(4 * d, d)
        self.silu = torch.nn.SiLU()
        self.drop = torch.nn.Dropout(0.25)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        # unsupported: left alone
        self.relu = torch.nn.ReLU()
        self.conv = torch.nn.Conv1d(d, d, 1)
        self.mine = MyLinear(d, d)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, idx):
        x = self.emb(idx)
        x = self.rms(self.ln(x))
        x = x + self.fc2(self.gelu(self.fc1(x)))
        x = self.drop(self.silu(x)) * self.scale
        return self.head(x)


def _by_hand(net: Net, idx: torch.Tensor, generator=None) -> torch.Tensor:
    """The converted Net's forward from carbon's functional ops, written out."""
    x = carbon.embedding(idx, net.emb.weight)
    x = carbon.layer_norm(x, net.ln.normalized_shape, net.ln.weight, net.ln.bias, net.ln.eps)
    x = carbon.rms_norm(x, net.rms.normalized_shape, net.rms.weight, net.rms.eps)
    h = carbon.gelu(carbon.linear(x, net.fc1.weight, net.fc1.bias), approximate="tanh")
    x = x + carbon.linear(h, net.fc2.weight, net.fc2.bias)
    x = carbon.silu(x)
    if net.training:
        x = carbon.dropout(x, 0.25, generator=generator)
    x = x * net.scale
    return carbon.linear(x, net.head.weight)


def _bits(t):
    return t.detach().contiguous().view(torch.int32)


def _net(seed=0):
    torch.manual_seed(seed)
    return Net()


def test_types_and_identity():
    net = _net()
    params = {n: p for n, p in net.named_parameters()}
    buffers = {n: b for n, b in net.named_buffers()}
    modules = dict(net.named_modules())
    before = fingerprint(net)
    assert carbon.nn.convert(net) is net
    expected = {"emb": carbon.nn.Embedding, "ln": carbon.nn.LayerNorm, "rms": carbon.nn.RMSNorm,
                "fc1": carbon.nn.Linear, "gelu": carbon.nn.GELU, "fc2": carbon.nn.Linear, "silu": carbon.nn.SiLU,
                "drop": carbon.nn.Dropout, "head": carbon.nn.Linear}
    for name, cls in expected.items():
        assert type(getattr(net, name)) is cls, name
        assert getattr(net, name) is modules[name]  # the same module objects
    assert type(net.relu) is torch.nn.ReLU and type(net.conv) is torch.nn.Conv1d and type(net.mine) is MyLinear
    for n, p in net.named_parameters():
        assert p is params[n], n
    for n, b in net.named_buffers():
        assert b is buffers[n], n
    assert fingerprint(net) == before  # no value changed
    assert net.gelu.approximate == "tanh" and net.drop.p == 0.25


def test_optimizer_built_before_keeps_working():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    carbon.nn.convert(net)
    w0 = net.fc1.weight.detach().clone()
    net.eval()
    net(torch.tensor([[1, 2, 3]])).square().sum().backward()
    opt.step()
    assert not torch.equal(net.fc1.weight, w0)


def test_forward_equals_carbon_ops_by_hand():
    net = carbon.nn.convert(_net())
    idx = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(1))
    net.eval()
    assert torch.equal(_bits(net(idx)), _bits(_by_hand(net, idx)))
    net.train()
    g1, g2 = carbon.Generator(seed=5), carbon.Generator(seed=5)
    net.drop.generator = g1
    assert torch.equal(_bits(net(idx)), _bits(_by_hand(net, idx, g2)))


def test_forward_close_to_torch_float64():
    torch_net = _net().eval()
    idx = torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(2))
    ref = torch_net.double()(idx)
    net = carbon.nn.convert(_net()).eval()
    out = net(idx)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_gradients_close_to_torch_float64():
    idx = torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(3))
    torch_net = _net().eval().double()
    torch_net(idx).square().mean().backward()
    net = carbon.nn.convert(_net()).eval()
    carbon.mean(net(idx).square()).backward()
    for (n, p), (_, q) in zip(net.named_parameters(), torch_net.named_parameters()):
        if q.grad is None:
            assert p.grad is None, n
            continue
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-6, msg=n)


def test_batch_and_thread_invariance(restore_num_threads):
    net = _net()
    net.relu, net.conv, net.mine = torch.nn.Identity(), torch.nn.Identity(), torch.nn.Identity()
    carbon.nn.convert(net).eval()
    idx = torch.randint(0, 11, (8, 13), generator=torch.Generator().manual_seed(4))
    torch.set_num_threads(1)
    one = net(idx)
    single = torch.cat([net(idx[i:i + 1]) for i in range(8)])
    torch.set_num_threads(2)
    two = net(idx)
    assert torch.equal(_bits(one), _bits(single))
    assert torch.equal(_bits(one), _bits(two))

    def grads(threads):
        torch.set_num_threads(threads)
        net.zero_grad()
        carbon.sum(net(idx)).backward()
        return {n: p.grad.clone() for n, p in net.named_parameters()}

    g1, g2 = grads(1), grads(2)
    assert fingerprint(g1) == fingerprint(g2)


def test_shared_module_converted_once_and_hooks_kept():
    lin = torch.nn.Linear(4, 4)
    seq = torch.nn.Sequential(lin, torch.nn.GELU(), lin)
    calls = []
    lin.register_forward_hook(lambda m, i, o: calls.append(type(m).__name__))
    carbon.nn.convert(seq)
    assert seq[0] is seq[2] is lin and type(lin) is carbon.nn.Linear
    seq(torch.randn(2, 4))
    assert calls == ["Linear", "Linear"]


def test_root_module_and_isinstance():
    lin = torch.nn.Linear(3, 2)
    out = carbon.nn.convert(lin)
    assert out is lin and type(lin) is carbon.nn.Linear and isinstance(lin, torch.nn.Linear)
    for cls in (torch.nn.GELU, torch.nn.SiLU, torch.nn.Dropout):
        m = carbon.nn.convert(cls())
        assert isinstance(m, cls) and type(m).__module__.startswith("carbon.nn")


def test_converted_dropout_generator():
    g = carbon.Generator(seed=3)
    m = carbon.nn.convert(torch.nn.Sequential(torch.nn.Dropout(0.5)), generator=g)
    x = torch.ones(64)
    y = m(x)
    assert g.offset == 1
    assert torch.equal(y, carbon.dropout(x, 0.5, generator=carbon.Generator(seed=3)))


def test_errors_leave_model_unchanged():
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Embedding(5, 3, max_norm=1.0))
    with pytest.raises(ValueError, match=r"'1'.*max_norm"):
        carbon.nn.convert(net)
    assert type(net[0]) is torch.nn.Linear  # checked before anything changed
    with pytest.raises(TypeError, match="torch.nn.Module"):
        carbon.nn.convert(lambda x: x)
    with pytest.raises(TypeError, match="carbon.Generator"):
        carbon.nn.convert(torch.nn.Linear(2, 2), generator=torch.Generator())


def test_from_torch_twins():
    d = carbon.nn.Dropout.from_torch(torch.nn.Dropout(0.3, inplace=True).eval())
    assert d.p == 0.3 and d.inplace and not d.training and d.generator is None
    g = carbon.nn.GELU.from_torch(torch.nn.GELU("tanh"))
    assert g.approximate == "tanh"
    s = carbon.nn.SiLU.from_torch(torch.nn.SiLU(inplace=True))
    assert s.inplace
    with pytest.raises(TypeError):
        carbon.nn.GELU.from_torch(torch.nn.SiLU())


# ---------------------------------------------------------------------------
# CausalSelfAttention


def _attn(seed=0, **kw):
    torch.manual_seed(seed)
    return carbon.nn.CausalSelfAttention(32, 4, **kw)


def test_attention_by_hand_and_shapes():
    m = _attn().eval()
    x = torch.randn(3, 10, 32, generator=torch.Generator().manual_seed(0))
    y = m(x)
    assert y.shape == x.shape
    qkv = carbon.linear(x, m.qkv.weight, m.qkv.bias)
    q, k, v = (qkv[..., i * 32:(i + 1) * 32].reshape(3, 10, 4, 8).permute(0, 2, 1, 3) for i in range(3))
    o = carbon.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = carbon.linear(o.permute(0, 2, 1, 3).reshape(3, 10, 32), m.proj.weight, m.proj.bias)
    assert torch.equal(_bits(y), _bits(ref))


def test_attention_close_to_torch_float64():
    m = _attn().eval()
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    q, k, v = F.linear(x, m.qkv.weight.double(), m.qkv.bias.double()).split(32, -1)
    q, k, v = (t.reshape(2, 12, 4, 8).transpose(1, 2) for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(8)
    s = s.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), -math.inf)
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(2, 12, 32)
    ref = F.linear(o, m.proj.weight.double(), m.proj.bias.double())
    torch.testing.assert_close(m(x.float()).double(), ref, rtol=1e-5, atol=1e-6)


def test_attention_causal_prefix_batch_and_threads(restore_num_threads):
    m = _attn(bias=False).eval()
    assert m.qkv.bias is None
    x = torch.randn(8, 16, 32, generator=torch.Generator().manual_seed(2))
    torch.set_num_threads(1)
    full = m(x)
    assert torch.equal(_bits(full[:, :5]), _bits(m(x[:, :5])))  # causal: the future does not matter, to the bit
    assert torch.equal(_bits(full[3:4]), _bits(m(x[3:4])))       # batch 1 vs 8
    torch.set_num_threads(2)
    assert torch.equal(_bits(full), _bits(m(x)))


def test_attention_dropout_and_errors():
    m = _attn(dropout=0.5)
    x = torch.randn(2, 6, 32)
    carbon.manual_seed(0)
    a = m(x)
    carbon.manual_seed(0)
    assert torch.equal(_bits(a), _bits(m(x)))
    m.eval()
    carbon.manual_seed(0)
    assert not torch.equal(_bits(a), _bits(m(x)))
    with pytest.raises(ValueError, match="multiple"):
        carbon.nn.CausalSelfAttention(30, 4)
    with pytest.raises(ValueError, match="expected input"):
        m(torch.randn(2, 6, 31))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_converted_model_same_bits_on_cuda():
    net = _net()
    net.relu, net.conv, net.mine = torch.nn.Identity(), torch.nn.Identity(), torch.nn.Identity()
    carbon.nn.convert(net).eval()
    idx = torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(5))
    cpu = net(idx)
    carbon.sum(cpu).backward()
    cpu_grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    net.zero_grad()
    net.cuda()
    gpu = net(idx.cuda())
    carbon.sum(gpu).backward()
    assert torch.equal(_bits(gpu.cpu()), _bits(cpu))
    assert fingerprint({n: p.grad for n, p in net.named_parameters()}) == fingerprint(cpu_grads)
    m = _attn().eval()
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(6))
    assert torch.equal(_bits(m.cuda()(x.cuda()).cpu()), _bits(m.cpu()(x)))
