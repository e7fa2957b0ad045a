"""carbon.nn.Linear is a drop-in torch.nn.Linear (same constructor,
parameters, initialization and state_dict) whose forward is carbon.linear."""

import pytest
import torch

import carbon
from data import BF16, F16, F32, generator, random_values
from oracle import assert_bits_equal, linear_bits, mm_bits, sum_to_shape_bits


@pytest.mark.parametrize("bias", [True, False])
def test_state_dict_matches_torch(bias):
    ours, theirs = carbon.nn.Linear(5, 3, bias=bias), torch.nn.Linear(5, 3, bias=bias)
    assert isinstance(ours, torch.nn.Linear)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    ours.load_state_dict(theirs.state_dict())
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    assert (ours.bias is None) == (not bias)


def test_same_initialization_as_torch_under_the_same_seed():
    torch.manual_seed(1234)
    theirs = torch.nn.Linear(7, 4)
    torch.manual_seed(1234)
    ours = carbon.nn.Linear(7, 4)
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_constructor_dtype_and_device(dtype):
    layer = carbon.nn.Linear(3, 2, device="cpu", dtype=dtype)
    assert layer.weight.dtype == dtype and layer.bias.dtype == dtype
    assert layer.in_features == 3 and layer.out_features == 2
    x = random_values((4, 3), dtype, generator(1))
    assert_bits_equal(layer(x), linear_bits(x, layer.weight, layer.bias), dtype=dtype)


def test_from_torch_shares_the_parameters():
    theirs = torch.nn.Linear(6, 2)
    ours = carbon.nn.Linear.from_torch(theirs)
    assert isinstance(ours, carbon.nn.Linear)
    assert ours.weight is theirs.weight and ours.bias is theirs.bias
    assert ours.in_features == 6 and ours.out_features == 2
    with torch.no_grad():  # an update through one is seen by the other
        theirs.weight.add_(1.0)
    x = random_values((3, 6), F32, generator(2))
    assert_bits_equal(ours(x), linear_bits(x, theirs.weight, theirs.bias))
    theirs.eval()
    assert not carbon.nn.Linear.from_torch(theirs).training
    no_bias = carbon.nn.Linear.from_torch(torch.nn.Linear(6, 2, bias=False))
    assert no_bias.bias is None
    assert_bits_equal(no_bias(x), linear_bits(x, no_bias.weight))


def test_from_torch_rejects_other_modules():
    with pytest.raises(TypeError):
        carbon.nn.Linear.from_torch(torch.nn.Conv1d(2, 2, 1))


@pytest.mark.parametrize("shape", [(9,), (4, 9), (2, 3, 9)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_backward_match_the_oracle(shape, bias):
    layer = carbon.nn.Linear(9, 5, bias=bias, dtype=BF16)
    g = generator(3)
    with torch.no_grad():
        layer.weight.copy_(random_values((5, 9), BF16, g))
        if bias:
            layer.bias.copy_(random_values((5,), BF16, g))
    x = random_values(shape, BF16, g).requires_grad_(True)
    out = layer(x)
    assert out.shape == shape[:-1] + (5,) and out.dtype == BF16
    assert_bits_equal(out, linear_bits(x.detach(), layer.weight.detach(), None if not bias else layer.bias.detach()))
    grad = random_values(out.shape, BF16, g)
    out.backward(grad)
    rows, grad_rows = x.detach().reshape(-1, 9), grad.reshape(-1, 5)
    assert_bits_equal(layer.weight.grad, mm_bits(grad_rows.t(), rows), "dW")
    assert_bits_equal(x.grad, mm_bits(grad_rows, layer.weight.detach()).reshape(shape), "dx")
    if bias:
        assert_bits_equal(layer.bias.grad, sum_to_shape_bits(grad_rows, (5,), BF16), "dbias")


def test_gradients_land_on_the_shared_torch_parameters():
    torch.manual_seed(0)
    theirs = torch.nn.Linear(8, 3)
    ours = carbon.nn.Linear.from_torch(theirs)
    opt = torch.optim.SGD(theirs.parameters(), lr=0.1)  # built on torch's module
    x = random_values((16, 8), F32, generator(4))
    out = ours(x)
    out.square().sum().backward()  # d/d out = 2 * out, exact
    grad_out = 2 * out.detach()
    assert_bits_equal(theirs.weight.grad, mm_bits(grad_out.t(), x), "dW on torch's parameter")
    assert_bits_equal(theirs.bias.grad, sum_to_shape_bits(grad_out, (3,), F32), "dbias on torch's parameter")
    before = theirs.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, ours.weight.detach())  # the step is seen through the carbon module
