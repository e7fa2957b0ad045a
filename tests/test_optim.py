"""carbon.optim (contract §12) against the independent reference of
optim_reference.py: every parameter and state bit after several steps, for
AdamW, Adam and SGD in every option combination and parameter dtype; then
against torch.optim within a tolerance, state_dict interchange with
torch.optim, thread-count invariance and errors."""

from __future__ import annotations

import contextlib
import copy
import math
from fractions import Fraction

import pytest
import torch

import carbon
from oracle import as_bits, bits_tensor, is_midpoint, round_bits
from optim_reference import adam_reference, from_values, sgd_reference, values
from optim_util import make_params, same_bits, set_grads, wide_values

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
STEPS = 4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["AdamW", "Adam"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("maximize", [False, True])
def test_adam_matches_reference(dtype, kind, weight_decay, maximize):
    params = make_params(dtype, 1)
    hp = dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=weight_decay, maximize=maximize)
    opt = getattr(carbon.optim, kind)(params, **hp)
    ref = [(values(p), [0.0] * p.numel(), [0.0] * p.numel()) for p in params]
    for step in range(1, STEPS + 1):
        set_grads(params, step)
        new_ref = []
        for p, (rp, rm, rv) in zip(params, ref):
            new_ref.append(adam_reference(rp, values(p.grad), rm, rv, step, lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-6,
                                          weight_decay=weight_decay, decoupled=kind == "AdamW", maximize=maximize,
                                          dtype=dtype))
        ref = new_ref
        opt.step()
        for i, (p, (rp, rm, rv)) in enumerate(zip(params, ref)):
            st = opt.state[p]
            assert st["step"].dtype == torch.float32 and st["step"].device.type == "cpu" and float(st["step"]) == step
            same_bits(p.detach(), from_values(rp, p, dtype), f"step {step} param {i}")
            same_bits(st["exp_avg"], from_values(rm, p, torch.float32), f"step {step} exp_avg {i}")
            same_bits(st["exp_avg_sq"], from_values(rv, p, torch.float32), f"step {step} exp_avg_sq {i}")


def assert_amsgrad_state(p, state, ref, dtype, label):
    """The parameter and the three float32 states of an AMSGrad step, bit for
    bit, against the reference's (p, m, v, v_max) values."""
    rp, rm, rv, rw = ref
    same_bits(p.detach(), from_values(rp, p, dtype), f"{label} param")
    for name, values_ in (("exp_avg", rm), ("exp_avg_sq", rv), ("max_exp_avg_sq", rw)):
        same_bits(state[name], from_values(values_, p, torch.float32), f"{label} {name}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["AdamW", "Adam"])
@pytest.mark.parametrize("weight_decay,maximize", [(0.0, False), (0.1, True)])
def test_amsgrad_matches_reference(dtype, kind, weight_decay, maximize):
    """amsgrad=True: the state max_exp_avg_sq = maximum(max_exp_avg_sq, v')
    and the denominator from it, every bit after several steps. Gradients
    shrink from step to step (scaled by 2^-4 each), so v' falls below the
    running maximum on most elements and the maximum decides the step."""
    params = make_params(dtype, 1)
    hp = dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=weight_decay, maximize=maximize)
    opt = getattr(carbon.optim, kind)(params, amsgrad=True, **hp)
    ref = [(values(p), [0.0] * p.numel(), [0.0] * p.numel(), [0.0] * p.numel()) for p in params]
    held = 0  # elements where the running maximum, not v', made the denominator
    for step in range(1, STEPS + 1):
        set_grads(params, step)
        for p in params:
            p.grad = (p.grad.float() * 2.0 ** (-4 * step)).to(dtype)
        new_ref = []
        for p, (rp, rm, rv, rw) in zip(params, ref):
            new_ref.append(adam_reference(rp, values(p.grad), rm, rv, step, lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-6,
                                          weight_decay=weight_decay, decoupled=kind == "AdamW", maximize=maximize,
                                          dtype=dtype, v_max=rw))
        ref = new_ref
        opt.step()
        for i, (p, (rp, rm, rv, rw)) in enumerate(zip(params, ref)):
            assert_amsgrad_state(p, opt.state[p], (rp, rm, rv, rw), dtype, f"step {step} param {i}")
            held += sum(w > v for v, w in zip(rv, rw))
    assert held > 40  # of 4 x 68 element updates


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("momentum,dampening,nesterov", [(0.0, 0.0, False), (0.9, 0.0, False), (0.9, 0.0, True),
                                                          (0.5, 0.25, False)])
@pytest.mark.parametrize("weight_decay,maximize", [(0.0, False), (0.01, True)])
def test_sgd_matches_reference(dtype, momentum, dampening, nesterov, weight_decay, maximize):
    params = make_params(dtype, 2)
    hp = dict(lr=0.05, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
              maximize=maximize)
    opt = carbon.optim.SGD(params, **hp)
    ref = [(values(p), [0.0] * p.numel()) for p in params]
    for step in range(1, STEPS + 1):
        set_grads(params, step)
        ref = [sgd_reference(rp, values(p.grad), rb, step == 1, lr=0.05, momentum=momentum, dampening=dampening,
                             weight_decay=weight_decay, nesterov=nesterov, maximize=maximize, dtype=dtype)
               for p, (rp, rb) in zip(params, ref)]
        opt.step()
        for i, (p, (rp, rb)) in enumerate(zip(params, ref)):
            same_bits(p.detach(), from_values(rp, p, dtype), f"step {step} param {i}")
            if momentum:
                same_bits(opt.state[p]["momentum_buffer"], from_values(rb, p, torch.float32), f"step {step} buf {i}")
            else:
                assert opt.state[p].get("momentum_buffer") is None


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    ia, ib = as_bits(a).long(), as_bits(b).long()
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF), ia)  # monotone integer order
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int((ia - ib).abs().max())


@pytest.mark.parametrize("kind,hp", [
    ("AdamW", dict(lr=1e-3, weight_decay=0.01)),
    ("Adam", dict(lr=1e-3, weight_decay=0.01)),
    ("AdamW", dict(lr=1e-3, weight_decay=0.01, amsgrad=True)),
    ("Adam", dict(lr=1e-3, weight_decay=0.01, amsgrad=True, maximize=True)),
    ("SGD", dict(lr=0.01, momentum=0.9, weight_decay=1e-4, nesterov=True)),
    ("SGD", dict(lr=0.01)),
])
def test_close_to_torch(kind, hp):
    """Tolerance: after 5 steps on N(0, 1) data, |ours - torch| <= 5 steps x
    (2 float32 ulps of the parameter + 1e-5 lr): torch rounds every
    intermediate to float32 (the update, then the subtraction) and computes
    Adam's moments with lerp, so each step may differ by an ulp of the
    parameter plus a relative ~1e-7 of the update (at most ~lr). AMSGrad's
    maximum of two float32 values is exact in both, so the same bound holds."""
    g = torch.Generator().manual_seed(5)
    base = [torch.randn(64, 32, generator=g), torch.randn(100, generator=g)]
    ours = [torch.nn.Parameter(t.clone()) for t in base]
    theirs = [torch.nn.Parameter(t.clone()) for t in base]
    opt_c = getattr(carbon.optim, kind)(ours, **hp)
    opt_t = getattr(torch.optim, kind)(theirs, foreach=False, **hp)
    for _ in range(5):
        grads = [torch.randn(t.shape, generator=g) for t in base]
        for p, q, gr in zip(ours, theirs, grads):
            p.grad, q.grad = gr.clone(), gr.clone()
        opt_c.step()
        opt_t.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=5 * 2 * 2.0**-23, atol=5e-5 * hp["lr"])


@pytest.mark.parametrize("kind,hp", [("AdamW", dict(lr=1e-3)), ("AdamW", dict(lr=1e-3, amsgrad=True)),
                                     ("Adam", dict(lr=1e-3, amsgrad=True)), ("SGD", dict(lr=0.01, momentum=0.9))])
def test_state_dict_interchange_with_torch(kind, hp):
    g = torch.Generator().manual_seed(7)
    base = [torch.randn(6, 4, generator=g), torch.randn(9, generator=g)]

    def grads_at(step):
        gg = torch.Generator().manual_seed(100 + step)
        return [torch.randn(t.shape, generator=gg) for t in base]

    # torch.optim -> carbon.optim: two torch steps, then carbon continues.
    tp = [torch.nn.Parameter(t.clone()) for t in base]
    topt = getattr(torch.optim, kind)(tp, **hp)
    for s in range(2):
        for p, gr in zip(tp, grads_at(s)):
            p.grad = gr
        topt.step()
    cp = [torch.nn.Parameter(p.detach().clone()) for p in tp]
    copt = getattr(carbon.optim, kind)(cp, **hp)
    copt.load_state_dict(copy.deepcopy(topt.state_dict()))
    # continuing from the same state in a fresh carbon optimizer built from
    # copies of the state gives the same bits (the state is all that matters)
    cp2 = [torch.nn.Parameter(p.detach().clone()) for p in tp]
    copt2 = getattr(carbon.optim, kind)(cp2, **hp)
    copt2.load_state_dict(copy.deepcopy(topt.state_dict()))  # (load shares tensors)
    for opt, ps in ((copt, cp), (copt2, cp2)):
        for p, gr in zip(ps, grads_at(2)):
            p.grad = gr
        opt.step()
    for a, b in zip(cp, cp2):
        assert torch.equal(as_bits(a.detach()), as_bits(b.detach()))
    if kind != "SGD":
        assert float(copt.state[cp[0]]["step"]) == 3
    # carbon.optim -> torch.optim: the state_dict has torch's keys and loads.
    sd = copt.state_dict()
    assert sd["param_groups"][0].keys() == topt.state_dict()["param_groups"][0].keys()
    tp2 = [torch.nn.Parameter(p.detach().clone()) for p in cp]
    topt2 = getattr(torch.optim, kind)(tp2, **hp)
    topt2.load_state_dict(copy.deepcopy(sd))
    for p, gr in zip(tp2, grads_at(3)):
        p.grad = gr
    topt2.step()
    for key in topt2.state[tp2[0]]:
        assert key in copt.state[cp[0]]
    assert topt2.state[tp2[0]].keys() == copt.state[cp[0]].keys()


@pytest.mark.parametrize("kind", ["AdamW", "Adam"])
def test_amsgrad_resumes_from_torch_state_dict(kind):
    """torch.optim's amsgrad state_dict (max_exp_avg_sq included) loads into
    carbon.optim, whose next step is the reference step from those states,
    bit for bit; carbon's state_dict loads back into torch.optim with the
    same state bits."""
    g = torch.Generator().manual_seed(11)
    base = [torch.randn(6, 4, generator=g), torch.randn(9, generator=g)]
    hp = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, amsgrad=True)
    tp = [torch.nn.Parameter(t.clone()) for t in base]
    topt = getattr(torch.optim, kind)(tp, **hp)
    for step in range(3):
        for p in tp:
            p.grad = torch.randn(p.shape, generator=g) * 2.0 ** -step  # shrinking: the maximum holds
        topt.step()
    cp = [torch.nn.Parameter(p.detach().clone()) for p in tp]
    copt = getattr(carbon.optim, kind)(cp, **hp)
    copt.load_state_dict(copy.deepcopy(topt.state_dict()))
    refs = []
    for p, q in zip(cp, tp):
        st = copt.state[p]
        same_bits(st["max_exp_avg_sq"], topt.state[q]["max_exp_avg_sq"], "loaded max_exp_avg_sq")
        p.grad = torch.randn(p.shape, generator=g) * 0.01
        refs.append(adam_reference(values(p), values(p.grad), values(st["exp_avg"]), values(st["exp_avg_sq"]), 4,
                                   lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.05,
                                   decoupled=kind == "AdamW", maximize=False, dtype=torch.float32,
                                   v_max=values(st["max_exp_avg_sq"])))
    copt.step()
    for i, (p, (rp, rm, rv, rw)) in enumerate(zip(cp, refs)):
        st = copt.state[p]
        same_bits(p.detach(), from_values(rp, p, torch.float32), f"param {i}")
        same_bits(st["exp_avg"], from_values(rm, p, torch.float32), f"exp_avg {i}")
        same_bits(st["exp_avg_sq"], from_values(rv, p, torch.float32), f"exp_avg_sq {i}")
        same_bits(st["max_exp_avg_sq"], from_values(rw, p, torch.float32), f"max_exp_avg_sq {i}")
    tq = [torch.nn.Parameter(p.detach().clone()) for p in cp]
    topt2 = getattr(torch.optim, kind)(tq, **hp)
    topt2.load_state_dict(copy.deepcopy(copt.state_dict()))
    for p, q in zip(cp, tq):
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            same_bits(topt2.state[q][key], copt.state[p][key], key)
        q.grad = torch.randn(q.shape, generator=g)
    topt2.step()  # torch steps from carbon's states


def test_bf16_states_stay_float32_through_state_dict():
    p = torch.nn.Parameter(torch.randn(10).bfloat16())
    opt = carbon.optim.AdamW([p], lr=0.1)
    p.grad = torch.randn(10).bfloat16()
    opt.step()
    q = torch.nn.Parameter(p.detach().clone())
    opt2 = carbon.optim.AdamW([q], lr=0.1)
    opt2.load_state_dict(opt.state_dict())
    for key in ("exp_avg", "exp_avg_sq"):
        assert opt2.state[q][key].dtype == torch.float32
        assert torch.equal(opt2.state[q][key], opt.state[p][key])


@pytest.mark.parametrize("kind,hp", [("AdamW", {}), ("AdamW", dict(amsgrad=True)), ("Adam", dict(amsgrad=True)),
                                     ("SGD", dict(momentum=0.9))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_thread_count_invariance(kind, hp, dtype, restore_num_threads):
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        params = [torch.nn.Parameter(wide_values((300, 257), dtype, 3))]
        opt = getattr(carbon.optim, kind)(params, lr=0.01, **hp)
        for step in range(3):
            set_grads(params, step + 1)
            opt.step()
        states = [t for k, t in sorted(opt.state[params[0]].items()) if k != "step"]
        results.append([as_bits(t).clone() for t in [params[0].detach()] + states])
    assert len(results[0]) == 1 + (1 if kind == "SGD" else 2 + bool(hp.get("amsgrad")))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_closure_and_params_without_grad():
    p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = carbon.optim.AdamW([p, q], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    assert float(opt.step(closure).detach()) == 3.0
    assert not torch.equal(p.detach(), torch.ones(3))
    assert torch.equal(q.detach(), torch.ones(3)) and q not in opt.state


@pytest.mark.parametrize("option", [dict(foreach=True), dict(fused=True), dict(differentiable=True)])
def test_unsupported_options(option):
    # (capturable=True is supported: tests/test_optim_capturable.py)
    with pytest.raises(ValueError, match="not supported"):
        carbon.optim.Adam([torch.nn.Parameter(torch.ones(2))], **option)
    with pytest.raises(ValueError, match="not supported"):
        carbon.optim.SGD([torch.nn.Parameter(torch.ones(2))], **option)


def test_op_errors():
    p, g = torch.ones(4), torch.ones(4)
    m, v = torch.zeros(4), torch.zeros(4)
    args = (1e-3, 0.9, 0.999, 1e-8, 0.0, 0.1, 0.03, True, False)
    with pytest.raises(TypeError, match="carbon.adam_step_: params\\[0\\] has dtype Double"):
        torch.ops.carbon.adam_step_([p.double()], [g.double()], [m], [v], [], *args)
    with pytest.raises(ValueError, match="expected as many grads as params"):
        torch.ops.carbon.adam_step_([p], [], [m], [v], [], *args)
    with pytest.raises(ValueError, match="exp_avg_sqs\\[0\\] has shape"):
        torch.ops.carbon.adam_step_([p], [g], [m], [torch.zeros(3)], [], *args)
    with pytest.raises(TypeError, match="exp_avgs\\[0\\] must be float32"):
        torch.ops.carbon.adam_step_([p], [g], [m.half()], [v], [], *args)
    with pytest.raises(TypeError, match="grads\\[0\\] has dtype"):
        torch.ops.carbon.adam_step_([p], [g.half()], [m], [v], [], *args)
    with pytest.raises(ValueError, match="expected as many max_exp_avg_sqs as params"):
        torch.ops.carbon.adam_step_([p, p], [g, g], [m, m], [v, v], [v], *args)
    with pytest.raises(TypeError, match="max_exp_avg_sqs\\[0\\] must be float32"):
        torch.ops.carbon.adam_step_([p], [g], [m], [v], [v.half()], *args)
    with pytest.raises(ValueError, match="must be contiguous"):
        torch.ops.carbon.sgd_step_([torch.ones(4, 4).t()], [torch.ones(4, 4).t()], [], 0.1, 0.0, 0.0, 0.0, False,
                                   False, False)
    with pytest.raises(ValueError, match="momentum_buffers must be empty"):
        torch.ops.carbon.sgd_step_([p], [g], [m], 0.1, 0.0, 0.0, 0.0, False, False, False)
    with pytest.raises(TypeError):
        carbon.optim.SGD([torch.nn.Parameter(torch.ones(2, dtype=torch.float64))], lr=0.1).step() if False else \
            torch.ops.carbon.sum_squares([torch.ones(2, dtype=torch.float64)])
    opt = carbon.optim.SGD([torch.nn.Parameter(torch.ones(2, dtype=torch.float64))], lr=0.1)
    opt.param_groups[0]["params"][0].grad = torch.ones(2, dtype=torch.float64)
    with pytest.raises(TypeError, match="supported dtypes are float32, bfloat16 and float16"):
        opt.step()


def test_power_is_binary_exponentiation():
    from optim_reference import beta_power
    for beta in (0.9, 0.999, 0.95, 0.3):
        for t in (1, 2, 3, 7, 100, 1001, 123456):
            assert carbon.optim.power(beta, t) == beta_power(beta, t)


def test_opcheck():
    p, g = [torch.randn(5), torch.randn(3)], [torch.randn(5), torch.randn(3)]
    m, v = [torch.zeros(5), torch.zeros(3)], [torch.zeros(5), torch.zeros(3)]
    torch.library.opcheck(torch.ops.carbon.adam_step_.default,
                          (p, g, m, v, [], 1e-3, 0.9, 0.999, 1e-8, 0.0, 0.1, 0.03, True, False),
                          test_utils=("test_schema", "test_faketensor"))
    w = [torch.rand(5), torch.rand(3)]
    torch.library.opcheck(torch.ops.carbon.adam_step_.default,
                          (p, g, m, v, w, 1e-3, 0.9, 0.999, 1e-8, 0.0, 0.1, 0.03, False, False),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.carbon.sgd_step_.default, (p, g, m, 0.1, 0.9, 0.0, 0.0, False, False, True),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.carbon.sum_squares.default, (g, True))
    torch.library.opcheck(torch.ops.carbon.clip_scale_.default, (g, torch.tensor(3.0), 1.0, 1e-6),
                          test_utils=("test_schema", "test_faketensor"))


def _ordinary(n: int, dtype: torch.dtype, seed: int, scale_exp: int = 0) -> torch.Tensor:
    """Normal-range values only (no zeros, subnormals or huge values): every
    256-element block of the CPU step takes its vectorized fast path, which
    wide_values' special values in every tensor would otherwise bypass."""
    from data import generator, random_values

    spread = {torch.float32: 20, torch.bfloat16: 20, torch.float16: 3}[dtype]
    return random_values((n,), dtype, generator(seed), spread=spread, scale_exp=scale_exp)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["AdamW", "Adam", "SGD"])
def test_fast_path_blocks_match_reference(dtype, kind):
    n = 1024
    p = torch.nn.Parameter(_ordinary(n, dtype, 7))
    if kind == "SGD":
        opt = carbon.optim.SGD([p], lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)
        ref_p, ref_b = values(p), [0.0] * n
    else:
        opt = getattr(carbon.optim, kind)([p], lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
        ref_p, ref_m, ref_v = values(p), [0.0] * n, [0.0] * n
    for step in (1, 2):
        p.grad = _ordinary(n, dtype, 100 + step, scale_exp=-2)
        if kind == "SGD":
            ref_p, ref_b = sgd_reference(ref_p, values(p.grad), ref_b, step == 1, lr=0.05, momentum=0.9,
                                         dampening=0.0, weight_decay=0.01, nesterov=True, maximize=False, dtype=dtype)
        else:
            ref_p, ref_m, ref_v = adam_reference(ref_p, values(p.grad), ref_m, ref_v, step, lr=1e-2, beta1=0.8,
                                                 beta2=0.99, eps=1e-6, weight_decay=0.1, decoupled=kind == "AdamW",
                                                 maximize=False, dtype=dtype)
        opt.step()
        same_bits(p.detach(), from_values(ref_p, p, dtype), f"{kind} step {step} param")
        if kind == "SGD":
            same_bits(opt.state[p]["momentum_buffer"], from_values(ref_b, p, torch.float32), f"step {step} buf")
        else:
            same_bits(opt.state[p]["exp_avg"], from_values(ref_m, p, torch.float32), f"step {step} exp_avg")
            same_bits(opt.state[p]["exp_avg_sq"], from_values(ref_v, p, torch.float32), f"step {step} exp_avg_sq")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["AdamW", "Adam"])
def test_amsgrad_fast_path_blocks_match_reference(dtype, kind):
    """AMSGrad through the vectorized blocks (bfloat16 / float16) and the
    AVX-512 loop (float32): ordinary values only, gradients shrinking from
    step to step so that the maximum decides most denominators."""
    n = 1024 + 7
    p = torch.nn.Parameter(_ordinary(n, dtype, 8))
    opt = getattr(carbon.optim, kind)([p], lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, amsgrad=True)
    ref_p, ref_m, ref_v, ref_w = values(p), [0.0] * n, [0.0] * n, [0.0] * n
    held = 0  # element updates whose denominator came from the running maximum, not v'
    for step in (1, 2, 3):
        p.grad = _ordinary(n, dtype, 110 + step, scale_exp=-2 - 3 * step)
        ref_p, ref_m, ref_v, ref_w = adam_reference(ref_p, values(p.grad), ref_m, ref_v, step, lr=1e-2, beta1=0.8,
                                                    beta2=0.99, eps=1e-6, weight_decay=0.1,
                                                    decoupled=kind == "AdamW", maximize=False, dtype=dtype,
                                                    v_max=ref_w)
        opt.step()
        assert_amsgrad_state(p, opt.state[p], (ref_p, ref_m, ref_v, ref_w), dtype, f"{kind} step {step}")
        held += sum(w > v for v, w in zip(ref_v, ref_w))
    assert held > n // 8


def _special_float32(n: int, seed: int, scale_exp: int) -> torch.Tensor:
    """Ordinary float32 values with NaN, +-inf, +-0 and subnormals spread
    through a length that is no multiple of 8 (the vector loops' lanes)."""
    x = _ordinary(n, torch.float32, seed, scale_exp=scale_exp)
    x[3::97] = float("nan")
    x[5::89] = float("inf")
    x[7::83] = float("-inf")
    x[11::79] = 0.0
    x[13::73] = -0.0
    x[17::71] = 3e-39  # subnormal
    x[19::67] = 1e-20  # its square underflows: v' subnormal or 0
    return x


def _canonical_nan(vals):
    return [math.nan if math.isnan(x) else x for x in vals]


@pytest.mark.parametrize("flush_denormal", [False, True])
@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("kind,maximize", [("AdamW", False), ("Adam", True)])
def test_adam_float32_special_values_match_reference(kind, maximize, amsgrad, flush_denormal):
    """float32 parameters take the CPU's AVX-512 loop where there is one, which
    rounds with the hardware conversion (RN32 under the default MXCSR only):
    NaN / inf gradients, subnormal and overflowing results, a tail of 7, and
    flush-to-zero mode (torch.set_flush_denormal; then the integer-rounding
    path must be taken). Under flush-to-zero one step only, from normal or
    zero inputs: its denormals-are-zero half reads subnormal inputs (the
    next step's states) as 0."""
    n = 1007
    p = torch.nn.Parameter(_ordinary(n, torch.float32, 11, scale_exp=-126))  # near the normal/subnormal edge
    p.data[::5] = _ordinary(n, torch.float32, 12)[::5]
    p.data[1::7] = 3e38  # + a large step overflows
    if flush_denormal:
        p.data[p.data.abs() < 1.1754944e-38] = 0.0
    lr, wd = 2e-38, 0.5
    opt = getattr(carbon.optim, kind)([p], lr=lr, betas=(0.8, 0.99), eps=1e-30, weight_decay=wd, maximize=maximize,
                                      amsgrad=amsgrad)
    ref_p, ref_m, ref_v, ref_w = values(p), [0.0] * n, [0.0] * n, [0.0] * n
    try:
        for step in (1,) if flush_denormal else (1, 2, 3):
            g = _special_float32(n, 200 + step, scale_exp=-60 * step)
            if flush_denormal:
                g[g.abs() < 1.1754944e-38] = 0.0
            g[1::7] = -1e30
            p.grad = g
            ref = adam_reference(ref_p, values(g), ref_m, ref_v, step, lr=lr, beta1=0.8, beta2=0.99, eps=1e-30,
                                 weight_decay=wd, decoupled=kind == "AdamW", maximize=maximize, dtype=torch.float32,
                                 v_max=ref_w if amsgrad else None)
            ref_p, ref_m, ref_v, ref_w = [_canonical_nan(r) for r in ref] + ([] if amsgrad else [ref_w])
            torch.set_flush_denormal(flush_denormal)
            opt.step()
            torch.set_flush_denormal(False)
            same_bits(p.detach(), from_values(ref_p, p, torch.float32), f"{kind} step {step} param")
            same_bits(opt.state[p]["exp_avg"], from_values(ref_m, p, torch.float32), f"step {step} exp_avg")
            same_bits(opt.state[p]["exp_avg_sq"], from_values(ref_v, p, torch.float32), f"step {step} exp_avg_sq")
            if amsgrad:
                same_bits(opt.state[p]["max_exp_avg_sq"], from_values(ref_w, p, torch.float32), f"step {step} max")
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.parametrize("flush_denormal", [False, True])
@pytest.mark.parametrize("lr", [2.0 ** -66, 1e30])
@pytest.mark.parametrize("hp", [dict(momentum=0.0), dict(momentum=0.9, maximize=True),
                                dict(momentum=0.9, nesterov=True, weight_decay=0.5),
                                dict(momentum=0.5, dampening=0.25, weight_decay=0.5, maximize=True)])
def test_sgd_float32_special_values_match_reference(hp, lr, flush_denormal):
    """float32 parameters take the CPU's AVX-512 SGD loop where there is one
    (sgd_avx512.h; hardware RN32 under the default MXCSR only): NaN / inf
    gradients, subnormal results (lr 2^-66 against p near 2^-126), overflow
    of p' and of the momentum buffer (lr 1e30; g = b = 3e38), the first step
    and later ones, a tail of 7, and flush-to-zero mode, where the
    integer-rounding path must be taken (one step from normal or zero
    inputs, as in the Adam test above)."""
    n = 1007
    p = torch.nn.Parameter(_ordinary(n, torch.float32, 21, scale_exp=-126))
    p.data[::5] = _ordinary(n, torch.float32, 22)[::5]
    p.data[1::7] = 3e38
    if flush_denormal:
        p.data[p.data.abs() < 1.1754944e-38] = 0.0
    full = {**dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False), **hp}
    opt = carbon.optim.SGD([p], lr=lr, **hp)
    ref_p, ref_b = values(p), [0.0] * n
    try:
        for step in (1,) if flush_denormal else (1, 2, 3):
            g = _special_float32(n, 300 + step, scale_exp=-60)
            if flush_denormal:
                g[g.abs() < 1.1754944e-38] = 0.0
            g[2::11] = 3e38
            p.grad = g
            ref_p, ref_b = sgd_reference(ref_p, values(g), ref_b, step == 1, lr=lr, dtype=torch.float32, **full)
            ref_p, ref_b = _canonical_nan(ref_p), _canonical_nan(ref_b)
            torch.set_flush_denormal(flush_denormal)
            opt.step()
            torch.set_flush_denormal(False)
            same_bits(p.detach(), from_values(ref_p, p, torch.float32), f"SGD {hp} step {step} param")
            if full["momentum"] != 0.0:
                buf = opt.state[p]["momentum_buffer"]
                same_bits(buf, from_values(ref_b, p, torch.float32), f"SGD {hp} step {step} buf")
    finally:
        torch.set_flush_denormal(False)


def _adam_op_reference(p, g, m, v, lr, beta1, beta2, eps, wd, bc1, c2s, decoupled, maximize):
    """Contract §12 with the op's own constants, in numpy float64 (IEEE
    operations, one rounding each; float32 results through the RN-even cast)."""
    import numpy as np

    with np.errstate(all="ignore"):
        p, g, m, v = (x.double().numpy() for x in (p, g, m, v))
        step_size, decay = lr / bc1, 1.0 - lr * wd
        gp = -g if maximize else g
        p0 = p * decay if decoupled else p
        if not decoupled and wd != 0.0:
            gp = gp + wd * p
        m1 = (beta1 * m + (1.0 - beta1) * gp).astype(np.float32).astype(np.float64)
        v1 = (beta2 * v + (1.0 - beta2) * (gp * gp)).astype(np.float32).astype(np.float64)
        denom = np.sqrt(v1) / c2s + eps
        p1 = (p0 - (step_size * m1) / denom).astype(np.float32)
    return [torch.from_numpy(x.astype(np.float32)) for x in (p1, m1, v1)]


def _nan_canonical(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t.isnan(), torch.full_like(t, float("nan")).abs(), t)


@pytest.mark.parametrize("c2s", [0.0316, 1.0, 4.0, 2.0 ** -20, 0.3, -0.5, 2.0 ** 1000, -(2.0 ** 960), 2.0 ** -1000,
                                 -3e-300, 0.0, float("inf"), float("nan")])
def test_adam_op_any_bias_correction(c2s):
    """The CPU step divides sqrt(v') by the host's c2s mostly through a
    reciprocal, checked lane by lane (adam_avx512.h): any c2s, with square
    roots from subnormal to huge, gives the IEEE quotient's bits."""
    n = 1003
    gen = torch.Generator().manual_seed(5)
    p = torch.randn(n, generator=gen)
    g = torch.randn(n, generator=gen) * torch.pow(2.0, torch.randint(-70, 60, (n,), generator=gen).float())
    m = torch.randn(n, generator=gen)
    v = torch.rand(n, generator=gen) * torch.pow(2.0, torch.randint(-149, 120, (n,), generator=gen).float())
    v[::41] = 0.0
    v[1::43] = 2.0 ** -149
    g[2::37] = float("nan")
    g[3::39] = float("inf")
    for decoupled, maximize in ((True, False), (False, True)):
        args = (1e-3, 0.5, 0.5, 1e-12, 0.1, 0.5, c2s, decoupled, maximize)
        ref = _adam_op_reference(p, g, m, v, *args)
        ps, ms, vs = [p.clone()], [m.clone()], [v.clone()]
        torch.ops.carbon.adam_step_(ps, [g.clone()], ms, vs, [], *args)
        for got, want, what in zip((ps[0], ms[0], vs[0]), ref, ("p", "m", "v")):
            same_bits(got, _nan_canonical(want), f"c2s={c2s} decoupled={decoupled} {what}")


def _float32_from_bits(bits) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


@pytest.mark.parametrize("flush_denormal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_amsgrad_op_special_states(dtype, flush_denormal):
    """The maximum with any max_exp_avg_sq state: NaNs of any sign and
    payload (quiet, signalling) propagate as float32's one NaN, +0 beats -0,
    ties, +-inf, subnormals, negative states (sqrt of a negative is NaN),
    states just above and below v'. float32 takes the AVX-512 loop where
    there is one (unless flush-to-zero is on), bfloat16 the blocks; under
    flush-to-zero the inputs are normal or zero (as in the tests above)."""
    n = 1003
    gen = torch.Generator().manual_seed(9)
    p = torch.randn(n, generator=gen).to(dtype)
    g = (torch.randn(n, generator=gen) * torch.pow(2.0, torch.randint(-30, 20, (n,), generator=gen).float())).to(dtype)
    g[::50] = 0.0
    m = torch.randn(n, generator=gen)
    v = torch.rand(n, generator=gen) * torch.pow(2.0, torch.randint(-60, 40, (n,), generator=gen).float())
    v[::50] = 0.0  # with g = 0: v' = +0
    lr, beta1, beta2, eps, wd, t = 1e-3, 0.9, 0.99, 1e-12, 0.1, 3
    bc1 = 1.0 - carbon.optim.power(beta1, t)
    c2s = math.sqrt(1.0 - carbon.optim.power(beta2, t))
    # v' itself (the plain step), to place states next to it
    v1 = v.clone()
    torch.ops.carbon.adam_step_([p.clone()], [g.clone()], [m.clone()], [v1], [], lr, beta1, beta2, eps, wd, bc1, c2s,
                                True, False)
    w = v1 * torch.pow(2.0, torch.randint(-3, 4, (n,), generator=gen).float())
    w[1::7] = v1[1::7]  # ties
    w[2::7] = torch.nextafter(v1[2::7], torch.tensor(math.inf))
    w[3::7] = torch.nextafter(v1[3::7], torch.tensor(-math.inf))
    w[::50] = -0.0  # against v' = +0
    w[25::50] = -1.5  # negative
    specials = [0x7FC00000, 0xFFC00000, 0x7FC12345, 0x7F800001, 0xFF800000, 0x7F800000, 0x00000001, 0x80000000,
                0x00400000]
    w[4::97] = _float32_from_bits(specials * (len(w[4::97]) // len(specials) + 1))[:len(w[4::97])]
    if flush_denormal:
        w[w.abs() < 1.1754944e-38] = 0.0
        v[v.abs() < 1.1754944e-38] = 0.0
        g[g.float().abs() < 1.1754944e-38] = 0.0
    for decoupled, maximize in ((True, False), (False, True)):
        ref = adam_reference(values(p), values(g), values(m), values(v), t, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                             weight_decay=wd, decoupled=decoupled, maximize=maximize, dtype=dtype, v_max=values(w))
        ps, ms, vs, ws = [p.clone()], [m.clone()], [v.clone()], [w.clone()]
        try:
            torch.set_flush_denormal(flush_denormal)
            torch.ops.carbon.adam_step_(ps, [g.clone()], ms, vs, ws, lr, beta1, beta2, eps, wd, bc1, c2s, decoupled,
                                        maximize)
        finally:
            torch.set_flush_denormal(False)
        for got, want, what in zip((ps[0], ms[0], vs[0], ws[0]), ref, ("p", "m", "v", "max_exp_avg_sq")):
            # the reference values are exact in got's format; round_bits gives Carbon's one NaN for NaN
            expected = bits_tensor([round_bits(x, got.dtype) for x in want], got.dtype)
            assert torch.equal(as_bits(got), expected), f"{decoupled=} {what}"
        if decoupled:  # g' = 0 there (no L2 term): v' = +0, which beats the state -0
            assert as_bits(ws[0][::50]).eq(0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_16bit_rounding_ties_subnormals_overflow(dtype, amsgrad):
    """RN_F of p' for bfloat16 / float16 parameters, which the CPU's AVX-512
    loop rounds to odd into float32 and then to nearest-even into F: exact
    ties (betas 0, eps 0, c2s 1 make the update exactly lr * sign(g), and lr
    is half an ulp of p for one binade of p at each lr), values a hair off
    the ties (eps 2^-30: closer than float32 resolves, so rounding to
    nearest float32 first would make them ties), subnormal and zero
    results, overflow to +-inf, NaN, a tail of 3 elements; against the
    reference's rounding of the fp64 value."""
    from optim_reference import rn, rn32

    precision, min_exp, top = {torch.bfloat16: (8, -133, 3.3e38), torch.float16: (11, -24, 65504.0)}[dtype]
    n = 1024 + 3
    gen = torch.Generator().manual_seed(13)
    lo = min_exp + precision - 1
    p = (torch.rand(n, generator=gen, dtype=torch.float64) + 1) * torch.pow(
        2.0, torch.randint(lo - 2, lo + 24, (n,), generator=gen).double())
    p = torch.where(torch.rand(n, generator=gen) < 0.5, -p, p).to(dtype)
    p[::31] = top  # + lr overflows for maximize
    p[1::37] = -top
    p[2::41] = float("nan")
    g = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).to(dtype)  # g^2 = 1: denom = 1 + eps
    ties = double_rounding_traps = 0
    for eps in (0.0, 2.0 ** -30):
        for k in (-2, 0, 5, 14):
            for maximize in (False, True):
                lr = 2.0 ** (lo - precision + k)  # half an ulp of p in the binade 2^(lo + k)
                if maximize and k == 14:
                    lr = top / 2 ** (precision + 1)  # huge steps: overflow
                q = torch.nn.Parameter(p.clone())
                q.grad = g.clone()
                opt = carbon.optim.Adam([q], lr=lr, betas=(0.0, 0.0), eps=eps, maximize=maximize, amsgrad=amsgrad)
                opt.step()
                ref = adam_reference(values(p), values(g), [0.0] * n, [0.0] * n, 1, lr=lr, beta1=0.0, beta2=0.0,
                                     eps=eps, weight_decay=0.0, decoupled=False, maximize=maximize, dtype=dtype,
                                     v_max=[0.0] * n if amsgrad else None)
                expected = bits_tensor([round_bits(x, dtype) for x in ref[0]], dtype)
                assert torch.equal(as_bits(q.detach()), expected), f"lr {lr} {eps=} {maximize=}"
                for x, gi in zip(values(p), values(g)):
                    if not math.isfinite(x):
                        continue
                    update = lr * (-gi if maximize else gi)
                    ties += eps == 0.0 and is_midpoint(Fraction(x) - Fraction(update), dtype)
                    exact = x - update / (1.0 + eps)  # the fp64 value p' rounds
                    double_rounding_traps += rn(rn32(exact), dtype) != rn(exact, dtype)
    assert ties > 100 and double_rounding_traps > 100


# ---- layouts: channels_last, transposed and gapped parameters step as their contiguous twins -----------------------

def _layouts(dtype):
    """(name, parameter in that layout, its gradient) from contiguous values: every element's update must not
    depend on where it lives (contract §12 "Layouts")."""
    conv = wide_values((4, 3, 5, 2), dtype, 21)
    conv_grad = wide_values((4, 3, 5, 2), dtype, 22)
    mat = wide_values((9, 6), dtype, 23)
    mat_grad = wide_values((9, 6), dtype, 24)
    base = wide_values((5, 14), dtype, 25)
    return [
        ("channels_last", conv.to(memory_format=torch.channels_last), conv_grad.to(memory_format=torch.channels_last)),
        ("channels_last, contiguous grad", conv.to(memory_format=torch.channels_last), conv_grad),
        ("transposed", mat.t().contiguous().t(), mat_grad.t().contiguous().t()),
        ("gapped", base[:, ::2], wide_values((5, 7), dtype, 26)),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("make", [
    lambda ps: carbon.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    lambda ps: carbon.optim.Adam(ps, lr=1e-2, weight_decay=0.1, amsgrad=True),
    lambda ps: carbon.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.1),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
], ids=["AdamW", "Adam-amsgrad", "SGD-nesterov", "torch.AdamW-enabled"])
def test_any_layout_steps_like_contiguous(dtype, make):
    for name, start, grad in _layouts(dtype):
        odd = torch.nn.Parameter(start.clone() if name != "gapped" else start)
        plain = torch.nn.Parameter(start.contiguous().clone())
        assert not odd.is_contiguous() and plain.is_contiguous()
        odd_opt, plain_opt = make([odd]), make([plain])
        under_enable = type(odd_opt) is torch.optim.AdamW  # torch's optimizer: carbon's step only while enabled
        with carbon.enabled() if under_enable else contextlib.nullcontext():
            for t in range(3):
                odd.grad, plain.grad = grad.clone() * (t + 1), grad.contiguous() * (t + 1)
                odd_opt.step()
                plain_opt.step()
        same_bits(odd.detach().contiguous(), plain.detach(), f"{name} parameter")
        for key, value in plain_opt.state[plain].items():
            if key != "step":
                kept = odd_opt.state[odd][key]
                same_bits(kept.contiguous(), value, f"{name} {key}")
                if name.startswith("channels_last"):
                    assert kept.stride() == odd.stride(), f"{key} is not laid out like its parameter"


def test_clip_grad_norm_any_layout():
    for dtype in DTYPES:
        grads = [g for _, _, g in _layouts(dtype)]
        odd = [torch.nn.Parameter(torch.zeros(g.shape, dtype=dtype)) for g in grads]
        plain = [torch.nn.Parameter(torch.zeros(g.shape, dtype=dtype)) for g in grads]
        for o, p, g in zip(odd, plain, grads):
            o.grad, p.grad = g.clone(), g.contiguous()
        odd[3].grad = torch.zeros(5, 14, dtype=dtype)[:, ::2].copy_(grads[3])  # a gradient with gaps
        total_odd = carbon.nn.utils.clip_grad_norm_(odd, 1.0)
        total_plain = carbon.nn.utils.clip_grad_norm_(plain, 1.0)
        same_bits(total_odd, total_plain, "total norm")
        for o, p in zip(odd, plain):
            same_bits(o.grad.contiguous(), p.grad, "clipped gradient")
        assert odd[0].grad.is_contiguous(memory_format=torch.channels_last)
