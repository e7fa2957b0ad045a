"""Capturable Adam / AdamW (contract §12, "CUDA graphs"): with capturable=True the step count lives in a
float32 tensor on the parameter's device and the learning rate may be a tensor; the kernel reads both, so
a CUDA graph can capture the step. Every bit is checked against the independent reference of
optim_reference.py (here on the CPU; tests/test_optim_cuda.py replays captured steps on a GPU)."""

from __future__ import annotations

import copy

import pytest
import torch

import carbon
from optim_reference import adam_reference, from_values, values
from optim_util import make_params, same_bits, set_grads

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HP = dict(betas=(0.8, 0.99), eps=1e-6)


def reference_step(params, refs, t, lr, wd, kind, maximize, amsgrad, dtype):
    out = []
    for p, r in zip(params, refs):
        out.append(adam_reference(r[0], values(p.grad), r[1], r[2], t, lr=lr, beta1=0.8, beta2=0.99, eps=1e-6,
                                  weight_decay=wd, decoupled=kind == "AdamW", maximize=maximize, dtype=dtype,
                                  v_max=r[3] if amsgrad else None))
    return out


def check_against(opt, params, refs, dtype, amsgrad, label):
    for i, (p, r) in enumerate(zip(params, refs)):
        st = opt.state[p]
        same_bits(p.detach(), from_values(r[0], p, dtype), f"{label} param {i}")
        names = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if amsgrad else ())
        for name, vals in zip(names, r[1:]):
            same_bits(st[name], from_values(vals, p, torch.float32), f"{label} {name} {i}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["AdamW", "Adam"])
@pytest.mark.parametrize("weight_decay,maximize,amsgrad", [(0.0, False, False), (0.1, True, False),
                                                           (0.1, False, True)])
def test_capturable_step_matches_reference(dtype, kind, weight_decay, maximize, amsgrad):
    """Every parameter and state bit after several steps; the step count is a
    float32 tensor on the parameter's device holding t."""
    params = make_params(dtype, 5)
    opt = getattr(carbon.optim, kind)(params, lr=1e-2, weight_decay=weight_decay, maximize=maximize,
                                      amsgrad=amsgrad, capturable=True, **HP)
    refs = [(values(p), [0.0] * p.numel(), [0.0] * p.numel(), [0.0] * p.numel()) for p in params]
    for t in range(1, 5):
        set_grads(params, t)
        refs = reference_step(params, refs, t, 1e-2, weight_decay, kind, maximize, amsgrad, dtype)
        opt.step()
        check_against(opt, params, refs, dtype, amsgrad, f"step {t}")
        for p in params:
            step = opt.state[p]["step"]
            assert step.dtype == torch.float32 and step.device == p.device and float(step) == t


@pytest.mark.parametrize("lr_dtype", [torch.float32, torch.float64])
def test_tensor_learning_rate_read_at_each_step(lr_dtype):
    """lr as a tensor (what a CUDA graph needs for a schedule): each step uses
    the value the tensor holds then, as a scheduler's fill_ leaves it."""
    dtype = torch.bfloat16
    params = make_params(dtype, 9)
    lr = torch.tensor(1e-2, dtype=lr_dtype)
    opt = carbon.optim.AdamW(params, lr=lr, weight_decay=0.1, capturable=True, **HP)
    refs = [(values(p), [0.0] * p.numel(), [0.0] * p.numel(), None) for p in params]
    for t, value in enumerate((1e-2, 3e-3, 7e-4), start=1):
        lr.fill_(value)
        set_grads(params, t)
        refs = reference_step(params, refs, t, float(lr), 0.1, "AdamW", False, False, dtype)
        opt.step()
        check_against(opt, params, refs, dtype, False, f"step {t}")


@pytest.mark.parametrize("start", [0.0, 122.0, 1000.0, 2.0**24 - 2, 2.0**24, 3.0e38])
def test_any_step_count(start):
    """t's bias corrections by binary exponentiation for any float32 count,
    large ones included (t + 1 rounds to t in float32 from 2^24 on, as the
    default path's count does)."""
    params = make_params(torch.float32, 2)
    opt = carbon.optim.Adam(params, lr=1e-2, amsgrad=False, capturable=True, **HP)
    set_grads(params, 1)
    opt.step()  # creates the states; then every count is set to start
    for p in params:
        opt.state[p]["step"].fill_(start)
    t = int(torch.tensor(start + 1.0, dtype=torch.float64).float())  # RN32(start + 1)
    set_grads(params, 2)
    refs = [(values(p), values(opt.state[p]["exp_avg"]), values(opt.state[p]["exp_avg_sq"]), None) for p in params]
    refs = reference_step(params, refs, t, 1e-2, 0.0, "Adam", False, False, torch.float32)
    opt.step()
    check_against(opt, params, refs, torch.float32, False, f"t = {t}")
    assert float(opt.state[params[0]]["step"]) == t


@pytest.mark.parametrize("kind", ["AdamW", "Adam"])
def test_state_dicts_move_between_default_and_capturable(kind):
    """Two default steps, the state_dict loaded into a capturable optimizer
    (the count becomes a tensor on the parameter's device), two more steps:
    the reference's four steps; and back."""
    dtype = torch.float32
    params = make_params(dtype, 3)
    first = getattr(carbon.optim, kind)(params, lr=1e-2, weight_decay=0.05, **HP)
    refs = [(values(p), [0.0] * p.numel(), [0.0] * p.numel(), None) for p in params]
    for t in (1, 2):
        set_grads(params, t)
        refs = reference_step(params, refs, t, 1e-2, 0.05, kind, False, False, dtype)
        first.step()
    second = getattr(carbon.optim, kind)(params, lr=1e-2, weight_decay=0.05, capturable=True, **HP)
    second.load_state_dict(copy.deepcopy(first.state_dict()))
    for t in (3, 4):
        set_grads(params, t)
        refs = reference_step(params, refs, t, 1e-2, 0.05, kind, False, False, dtype)
        second.step()
        check_against(second, params, refs, dtype, False, f"step {t}")
    third = getattr(carbon.optim, kind)(params, lr=1e-2, weight_decay=0.05, **HP)
    third.load_state_dict(copy.deepcopy(second.state_dict()))
    set_grads(params, 5)
    refs = reference_step(params, refs, 5, 1e-2, 0.05, kind, False, False, dtype)
    third.step()
    check_against(third, params, refs, dtype, False, "step 5")


def test_torch_optimizer_with_capturable_under_enable():
    """torch.optim.AdamW(capturable=True) stepped under carbon.enable runs
    carbon's capturable step (torch itself refuses capturable CPU params)."""
    dtype = torch.float32
    params = make_params(dtype, 4)
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, capturable=True, **HP)
    refs = [(values(p), [0.0] * p.numel(), [0.0] * p.numel(), None) for p in params]
    for t in (1, 2):
        set_grads(params, t)
        refs = reference_step(params, refs, t, 1e-2, 0.1, "AdamW", False, False, dtype)
        with carbon.enabled(seed=0):
            opt.step()
        check_against(opt, params, refs, dtype, False, f"step {t}")


def test_op_errors():
    p, g, m, v = torch.ones(4), torch.ones(4), torch.zeros(4), torch.zeros(4)
    step = torch.ones(())
    rest = (0.9, 0.999, 1e-8, 0.0, True, False)
    op = torch.ops.carbon.adam_step_capturable_
    with pytest.raises(ValueError, match="expected as many steps as params"):
        op([p], [g], [m], [v], [], [], 1e-3, None, *rest)
    with pytest.raises(TypeError, match=r"steps\[0\] must be a one-element float32 tensor"):
        op([p], [g], [m], [v], [], [step.double()], 1e-3, None, *rest)
    with pytest.raises(TypeError, match=r"steps\[0\] must be a one-element float32 tensor"):
        op([p], [g], [m], [v], [], [torch.ones(2)], 1e-3, None, *rest)
    with pytest.raises(TypeError, match="lr must be a one-element float32 or float64 tensor"):
        op([p], [g], [m], [v], [], [step], 1e-3, torch.ones((), dtype=torch.int64), *rest)
    with pytest.raises(TypeError, match="lr must be a one-element float32 or float64 tensor"):
        op([p], [g], [m], [v], [], [step], 1e-3, torch.ones(2), *rest)
    with pytest.raises(TypeError, match=r"exp_avgs\[0\] must be float32"):
        op([p], [g], [m.half()], [v], [], [step], 1e-3, None, *rest)
    assert torch.equal(p, torch.ones(4)) and float(step) == 1.0  # nothing changed by a refused call


def test_opcheck():
    p, g = [torch.randn(5), torch.randn(3)], [torch.randn(5), torch.randn(3)]
    m, v = [torch.zeros(5), torch.zeros(3)], [torch.zeros(5), torch.zeros(3)]
    steps = [torch.ones(()), torch.ones(())]
    torch.library.opcheck(torch.ops.carbon.adam_step_capturable_.default,
                          (p, g, m, v, [], steps, 1e-3, None, 0.9, 0.999, 1e-8, 0.0, True, False),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.carbon.adam_step_capturable_.default,
                          (p, g, m, v, [torch.rand(5), torch.rand(3)], steps, 0.0, torch.tensor(1e-3), 0.9, 0.999,
                           1e-8, 0.1, False, True),
                          test_utils=("test_schema", "test_faketensor"))
