"""carbon.embedding / carbon.nn.Embedding: the forward gathers rows (exact);
the weight gradient is, for each row j, RN(exact sum of the output gradients
of every token equal to j), one rounding (+0 for rows no token uses, zeros
for padding_idx) -- docs/contract.md §11. Compared bit for bit with the
exact oracle (scatter_reference.embedding_grad_bits)."""

import math

import pytest
import torch

import carbon
from data import DTYPES, F16, F32, exact_tensor, generator, random_values, seed_of
from oracle import as_bits, assert_bits_equal, fmt_of
from scatter_reference import embedding_grad_bits


def tokens(shape, vocab, g):
    """Token ids with many repeats (a few hot tokens)."""
    t = torch.randint(0, vocab, shape, generator=g)
    hot = torch.randint(0, 3, shape, generator=g)
    return torch.where(torch.rand(shape, generator=g) < 0.5, hot, t)


def grad_of_weight(weight, indices, grad, padding_idx=None):
    w = weight.detach().clone().requires_grad_()
    out = carbon.embedding(indices, w, padding_idx)
    out.backward(grad)
    return out, w.grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padding_idx", [None, 1, -2])
def test_embedding_forward_and_backward(dtype, padding_idx):
    g = generator(seed_of(str(dtype), padding_idx))
    vocab, dim = 9, 5
    weight = random_values((vocab, dim), dtype, g)
    indices = tokens((4, 7), vocab, g)
    grad = random_values((4, 7, dim), dtype, g, spread=30 if dtype != F16 else 5)
    out, gw = grad_of_weight(weight, indices, grad, padding_idx)
    assert torch.equal(as_bits(out), as_bits(weight[indices]))
    pad = None if padding_idx is None else padding_idx % vocab
    assert_bits_equal(gw, embedding_grad_bits(grad, indices, vocab, pad, dtype), f"grad_weight {dtype}", dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_backward_adversarial(dtype):
    f = fmt_of(dtype)
    big = 2.0**100 if dtype != F16 else 2.0**14
    half_ulp = 2.0 ** -f.precision
    tiny = 2.0 ** f.quantum_exp
    # token 0: 1 + tie + quantum with big cancelling -> rounds up; token 1: every term -0 -> -0;
    # token 2: NaN; token 3: -0 and +0 -> +0; token 4: unused -> +0
    rows = [[1.0], [big], [half_ulp], [-big], [tiny], [-0.0], [-0.0], [math.nan], [1.0], [-0.0], [0.0]]
    toks = [0, 0, 0, 0, 0, 1, 1, 2, 2, 3, 3]
    grad = exact_tensor(rows, dtype)
    indices = torch.tensor(toks)
    _, gw = grad_of_weight(torch.zeros(5, 1, dtype=dtype), indices, grad)
    assert_bits_equal(gw, embedding_grad_bits(grad, indices, 5, None, dtype), "adversarial", dtype=dtype)
    assert math.copysign(1.0, gw[1, 0].item()) < 0 and math.copysign(1.0, gw[4, 0].item()) > 0


def test_embedding_order_and_threads(restore_num_threads):
    g = generator(21)
    weight = random_values((6, 300), F32, g)
    indices = tokens((64,), 6, g)
    grad = random_values((64, 300), F32, g, spread=40)
    ref = embedding_grad_bits(grad, indices, 6, None, F32)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for seed in range(2):
            perm = torch.randperm(64, generator=generator(seed))
            _, gw = grad_of_weight(weight, indices[perm], grad[perm])
            assert_bits_equal(gw, ref, f"{threads} threads, permutation {seed}")


def test_embedding_nan_canonical_and_empty():
    w = exact_tensor([[1.0, math.nan], [2.0, 3.0]], F32)
    w[0, 1] = torch.tensor(0x7FC12345, dtype=torch.int32).view(torch.float32)  # a NaN with a payload
    out = carbon.embedding(torch.tensor([0, 0]), w)
    assert as_bits(out)[1, 1].item() == fmt_of(F32).nan_bits
    _, gw = grad_of_weight(w, torch.empty(0, dtype=torch.long), torch.empty(0, 2))
    assert torch.equal(as_bits(gw), torch.zeros(2, 2, dtype=torch.int32))


def test_nn_embedding_module():
    torch.manual_seed(0)
    ref = torch.nn.Embedding(11, 4, padding_idx=3)
    mine = carbon.nn.Embedding(11, 4, padding_idx=3)
    assert set(mine.state_dict()) == set(ref.state_dict())
    mine.load_state_dict(ref.state_dict())
    twin = carbon.nn.Embedding.from_torch(ref)
    assert twin.weight is ref.weight and twin.padding_idx == 3
    idx = torch.tensor([[3, 1, 1], [0, 3, 1]])
    out = twin(idx)
    grad = random_values((2, 3, 4), F32, generator(1))
    out.backward(grad)
    assert_bits_equal(ref.weight.grad, embedding_grad_bits(grad, idx, 11, 3, F32), "from_torch grad")
    with pytest.raises(ValueError, match="max_norm"):
        carbon.nn.Embedding(5, 2, max_norm=1.0)
    with pytest.raises(ValueError, match="sparse"):
        carbon.nn.Embedding(5, 2, sparse=True)


@pytest.mark.cpu_kernels
def test_embedding_opcheck_compile_and_errors():
    g = generator(30)
    w = random_values((7, 3), F32, g)
    idx = torch.tensor([[1, 6], [1, 0]])
    torch.library.opcheck(torch.ops.carbon.embedding.default, (w, idx, 1))
    torch.library.opcheck(torch.ops.carbon.embedding_backward.default, (random_values((2, 2, 3), F32, g), idx, 7, -1))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(i, weight):
        return carbon.embedding(i, weight, 0) * 1

    assert torch.equal(as_bits(f(idx, w)), as_bits(w[idx]))
    with pytest.raises(IndexError, match="carbon.embedding:"):
        carbon.embedding(torch.tensor([7]), w)
    with pytest.raises(TypeError, match="carbon.embedding:"):
        carbon.embedding(idx.float(), w)
    with pytest.raises(TypeError, match="carbon.embedding:"):
        carbon.embedding(idx, w.double())
    with pytest.raises(ValueError, match="carbon.embedding:"):
        carbon.embedding(idx, w, padding_idx=7)
    with pytest.raises(ValueError, match="carbon.embedding:"):
        carbon.embedding(idx, w[0])
    with pytest.raises(ValueError, match="carbon.embedding_backward:"):
        torch.ops.carbon.embedding_backward(torch.zeros(3, 3), idx, 7, -1)
