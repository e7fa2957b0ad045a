"""On a CUDA GPU the optimizer steps, the sum of squares and clipping give
the same bits as on the CPU (contract §12), with no host synchronization.
Skipped without a GPU."""

from __future__ import annotations

import math

import pytest
import torch

import carbon
from oracle import as_bits
from optim_util import wide_values

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
CONFIGS = [
    ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
    ("Adam", dict(lr=1e-2, weight_decay=0.1, maximize=True)),
    ("AdamW", dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    ("Adam", dict(lr=1e-2, weight_decay=0.1, maximize=True, amsgrad=True)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.5, dampening=0.25)),
    ("SGD", dict(lr=0.05)),
]


def run(kind, hp, dtype, device, steps=4, clip=None, scale=1.0, shapes=((70, 33), (100003,))):
    params = [torch.nn.Parameter(wide_values(s, dtype, i).to(device)) for i, s in enumerate(shapes)]
    opt = getattr(carbon.optim, kind)(params, **hp)
    norms = []
    for step in range(steps):
        for i, p in enumerate(params):
            p.grad = (wide_values(p.shape, dtype, 100 * step + i) * scale).to(device)
        if clip is not None:
            norms.append(carbon.nn.utils.clip_grad_norm_(params, **clip).cpu())
        opt.step()
    states = [t for p in params for k, t in sorted(opt.state[p].items()) if k != "step"]
    return [p.detach().cpu() for p in params] + [t.cpu() for t in states] + norms


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,hp", CONFIGS)
def test_steps_match_cpu(kind, hp, dtype):
    for a, b in zip(run(kind, hp, dtype, "cuda"), run(kind, hp, dtype, "cpu")):
        assert torch.equal(as_bits(a), as_bits(b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_type", [2.0, math.inf])
@pytest.mark.parametrize("scale", [1.0, 2.0**-70])
def test_clip_matches_cpu(dtype, norm_type, scale):
    clip = dict(max_norm=0.5, norm_type=norm_type)
    hp = dict(lr=1e-3)
    gpu = run("AdamW", hp, dtype, "cuda", steps=2, clip=clip, scale=scale)
    cpu = run("AdamW", hp, dtype, "cpu", steps=2, clip=clip, scale=scale)
    for a, b in zip(gpu, cpu):
        assert torch.equal(as_bits(a), as_bits(b))


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_clip_of_nan_gradients_matches_cpu(norm_type):
    """NaN gradients of any sign and payload: the total and the gradients are
    the CPU's canonical NaNs."""
    def grads(device):
        g = torch.tensor([1.0, 2.0, 3.0, 4.0])
        g.view(torch.int32)[1] = 0x7FC00123
        g.view(torch.int32)[2] = 0xFFC00000 - (1 << 32)
        return [p.to(device) for p in (g, torch.tensor([0.5]))]

    out = []
    for device in ("cuda", "cpu"):
        ps = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads(device)]
        for p, g in zip(ps, grads(device)):
            p.grad = g
        total = carbon.nn.utils.clip_grad_norm_(ps, 1.0, norm_type)
        out.append([total.cpu()] + [p.grad.cpu() for p in ps])
    for a, b in zip(*out):
        assert torch.equal(as_bits(a), as_bits(b))


def test_sum_squares_exact_tier_on_gpu():
    g = [torch.tensor([1.0], device="cuda"), torch.tensor([2.0**-12], device="cuda")]
    assert float(torch.ops.carbon.sum_squares(g)) == 1.0  # the tie 1 + 2^-24, to even
    g.append(torch.tensor([2.0**-30], device="cuda"))
    assert float(torch.ops.carbon.sum_squares(g)) == 1.0 + 2.0**-23
    big = wide_values((1 << 20,), torch.float32, 4).cuda()
    assert torch.equal(as_bits(torch.ops.carbon.sum_squares([big, g[0]], True)),
                       as_bits(torch.ops.carbon.sum_squares([big.cpu(), g[0].cpu()], True)))


def test_no_host_sync():
    params = [torch.nn.Parameter(torch.randn(1000, device="cuda"))]
    params[0].grad = torch.randn(1000, device="cuda")
    opt = carbon.optim.AdamW(params)
    opt.step()  # states allocated
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        carbon.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        carbon.optim.SGD(params, lr=0.1, momentum=0.9).step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_device_errors():
    p = torch.ones(4, device="cuda")
    with pytest.raises(ValueError, match="expected all tensors on one device"):
        torch.ops.carbon.adam_step_([p], [torch.ones(4)], [torch.zeros(4, device="cuda")],
                                    [torch.zeros(4, device="cuda")], [], 1e-3, 0.9, 0.999, 1e-8, 0.0, 0.1, 0.03,
                                    True, False)
    with pytest.raises(ValueError, match="on one device"):
        torch.ops.carbon.sum_squares([p, torch.ones(2)])


@pytest.mark.parametrize("kind,hp", [CONFIGS[2], CONFIGS[4]])
def test_empty_and_tiny_parameters(kind, hp):
    """Empty parameters (no launch), one-element ones and a tail shorter than a
    block, with clipping over them (empty gradients are left out of the norm)."""
    shapes = ((0,), (1,), (3, 0), (5,), (257,))
    clip = dict(max_norm=0.5)
    for dtype in DTYPES:
        gpu = run(kind, hp, dtype, "cuda", steps=2, clip=clip, shapes=shapes)
        cpu = run(kind, hp, dtype, "cpu", steps=2, clip=clip, shapes=shapes)
        for a, b in zip(gpu, cpu):
            assert torch.equal(as_bits(a), as_bits(b))


def test_graph_capture_of_clip_and_sgd_step():
    """clip_grad_norm_ and SGD's step keep every value on the device (the
    total norm, the clip coefficient, the states), so a CUDA graph captures
    them; its replays, with new gradients copied in, give the CPU's bits."""
    dtype = torch.bfloat16
    shapes = ((70, 33), (1000,))
    grads = [[wide_values(s, dtype, 100 * k + i) for i, s in enumerate(shapes)] for k in range(4)]
    hp, clip = dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01), dict(max_norm=0.5)

    def make(device):
        params = [torch.nn.Parameter(wide_values(s, dtype, i).to(device)) for i, s in enumerate(shapes)]
        return params, carbon.optim.SGD(params, **hp)

    cpu_params, cpu_opt = make("cpu")
    cpu_norms = []
    for k in range(4):
        for p, g in zip(cpu_params, grads[k]):
            p.grad = g.clone()
        cpu_norms.append(carbon.nn.utils.clip_grad_norm_(cpu_params, **clip))
        cpu_opt.step()

    params, opt = make("cuda")
    for p, g in zip(params, grads[0]):
        p.grad = g.cuda()

    def step():
        total = carbon.nn.utils.clip_grad_norm_(params, **clip)
        opt.step()
        return total

    norms = []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # two eager steps (the first creates the momentum buffers)
        norms.append(step().clone())
        for p, g in zip(params, grads[1]):
            p.grad.copy_(g)
        norms.append(step().clone())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_total = step()
    for k in (2, 3):
        for p, g in zip(params, grads[k]):
            p.grad.copy_(g)
        graph.replay()
        norms.append(static_total.clone())
    torch.cuda.synchronize()
    for a, b in zip(params, cpu_params):
        assert torch.equal(as_bits(a.detach()), as_bits(b.detach())), "parameters"
        assert torch.equal(as_bits(opt.state[a]["momentum_buffer"]), as_bits(cpu_opt.state[b]["momentum_buffer"]))
    for k, (a, b) in enumerate(zip(norms, cpu_norms)):
        assert torch.equal(as_bits(a), as_bits(b)), f"total norm of step {k + 1}"


@pytest.mark.parametrize("kind,hp", [("AdamW", dict(weight_decay=0.1)), ("Adam", dict(amsgrad=True, maximize=True))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_capture_of_capturable_adam(kind, hp, dtype):
    """capturable=True: t lives on the device and lr is a device tensor, both
    read by the kernel, so a captured step replays as steps 2, 3, 4 (with new
    gradients copied in and the learning rate changed between replays, as a
    scheduler would) and gives the bits of four default steps on the CPU."""
    shapes = ((70, 33), (1000,))
    grads = [[wide_values(s, dtype, 100 * k + i) for i, s in enumerate(shapes)] for k in range(4)]
    lrs = (1e-2, 5e-3, 2e-3, 1e-3)

    cpu_params = [torch.nn.Parameter(wide_values(s, dtype, i)) for i, s in enumerate(shapes)]
    cpu_opt = getattr(carbon.optim, kind)(cpu_params, lr=lrs[0], **hp)
    for k in range(4):
        cpu_opt.param_groups[0]["lr"] = float(torch.tensor(lrs[k], dtype=torch.float32))  # the tensor's value
        for p, g in zip(cpu_params, grads[k]):
            p.grad = g.clone()
        cpu_opt.step()

    lr = torch.tensor(lrs[0], dtype=torch.float32, device="cuda")
    params = [torch.nn.Parameter(wide_values(s, dtype, i).cuda()) for i, s in enumerate(shapes)]
    opt = getattr(carbon.optim, kind)(params, lr=lr, capturable=True, **hp)
    for p, g in zip(params, grads[0]):
        p.grad = g.cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # one eager step creates the states
        opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    for k in (1, 2, 3):
        lr.fill_(lrs[k])
        for p, g in zip(params, grads[k]):
            p.grad.copy_(g)
        graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(params, cpu_params):
        assert torch.equal(as_bits(a.detach()), as_bits(b.detach())), "parameters"
        assert float(opt.state[a]["step"]) == 4.0 and opt.state[a]["step"].device == a.device
        for key, t in cpu_opt.state[b].items():
            if key != "step":
                assert torch.equal(as_bits(opt.state[a][key]), as_bits(t)), key


def test_capturable_adam_refuses_a_cpu_lr_tensor_in_capture():
    """A CPU lr tensor is read on the host: a graph would keep the captured value, so capture raises."""
    p = torch.nn.Parameter(torch.ones(100, device="cuda"))
    opt = carbon.optim.AdamW([p], lr=torch.tensor(1e-2), capturable=True)
    p.grad = torch.ones_like(p)
    opt.step()  # eagerly: the CPU value is read at the call, fine
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="lr is a CPU tensor"):
        with torch.cuda.graph(graph):
            opt.step()
    torch.cuda.synchronize()


@pytest.mark.parametrize("kind,hp", [("AdamW", dict(lr=1e-2)), ("SGD", dict(lr=0.05, momentum=0.9))])
def test_graph_capture_refused_where_a_replay_would_be_wrong(kind, hp):
    """Without capturable=True Adam's step count and bias corrections are host
    values, and SGD's first step creates its momentum buffers: a captured
    graph would replay the captured step's t (or a first step) forever, so
    capture raises."""
    p = torch.nn.Parameter(torch.ones(100, device="cuda"))
    opt = getattr(carbon.optim, kind)([p], **hp)
    p.grad = torch.ones_like(p)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=f"carbon.optim.{kind}.step: CUDA graph capture is not supported"):
        with torch.cuda.graph(graph):
            opt.step()
    torch.cuda.synchronize()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_tensors_on_a_non_current_device():
    """Steps, norms and clipping run on the tensors' device (a device guard)."""
    shapes = ((70, 33), (1000,))
    for kind, hp in (CONFIGS[2], CONFIGS[4]):
        with torch.cuda.device(0):
            gpu = run(kind, hp, torch.bfloat16, "cuda:1", steps=2, clip=dict(max_norm=0.5), shapes=shapes)
        cpu = run(kind, hp, torch.bfloat16, "cpu", steps=2, clip=dict(max_norm=0.5), shapes=shapes)
        for a, b in zip(gpu, cpu):
            assert torch.equal(as_bits(a), as_bits(b))


def test_sum_squares_exact_tier_over_many_blocks():
    """A sum of squares exactly at a float32 midpoint, 1 + 2^-24, spread over a
    large tensor (4096 squares of 2^-18 among zeros, so the exact tier's
    accumulators come from many blocks and chunks): ties to even give 1; one
    more tiny square breaks the tie upwards."""
    for dtype in DTYPES:
        spread = torch.zeros(300_000, dtype=dtype)
        spread[::73][:4096] = 2.0**-18 if dtype != torch.float16 else 2.0**-9
        one = torch.ones(1, dtype=dtype)
        # float16 cannot hold 2^-18: 4096 squares of 2^-9 make 2^-6, over a one of 2^9 (tie: 2^18 + 2^-6, ulp 2^-5 at 2^18).
        if dtype == torch.float16:
            one = torch.full((1,), 2.0**9, dtype=dtype)
        gpu = torch.ops.carbon.sum_squares([spread.cuda(), one.cuda()])
        cpu = torch.ops.carbon.sum_squares([spread, one])
        assert torch.equal(as_bits(gpu), as_bits(cpu)), dtype
        assert float(gpu) == float(one) ** 2, dtype  # the tie, to even
        nudge = torch.tensor([2.0**-20 if dtype != torch.float16 else 2.0**-14], dtype=dtype)
        gpu = torch.ops.carbon.sum_squares([spread.cuda(), one.cuda(), nudge.cuda()], True)
        cpu = torch.ops.carbon.sum_squares([spread, one, nudge], True)
        assert torch.equal(as_bits(gpu), as_bits(cpu)), dtype


def test_fused_torch_adamw_state_loaded_onto_the_gpu_steps_without_syncs():
    """torch.optim.AdamW(fused=True)'s load_state_dict puts the step counts on
    the parameters' device; under carbon.enable the step moves them to the CPU
    once (the first step after loading), then steps without host syncs, with
    the bits of the same training on the CPU."""
    def train(device, sync_check):
        params = [torch.nn.Parameter(wide_values((64, 33), torch.float32, 0).to(device))]
        grads = [wide_values((64, 33), torch.float32, 10 + step).to(device) for step in range(4)]
        with carbon.enabled():
            opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, fused=True)
            try:
                for step in range(4):
                    params[0].grad = grads[step]
                    opt.step()
                    if step == 1:  # a round trip through the state_dict: torch moves the counts to the device
                        opt.load_state_dict(opt.state_dict())
                        assert opt.state[params[0]]["step"].device.type == device
                    if step == 2 and sync_check:
                        torch.cuda.set_sync_debug_mode("error")
            finally:
                if sync_check:
                    torch.cuda.set_sync_debug_mode(0)
        state = opt.state[params[0]]
        return [params[0].detach().cpu(), state["exp_avg"].cpu(), state["exp_avg_sq"].cpu()]

    for a, b in zip(train("cuda", True), train("cpu", False)):
        assert torch.equal(as_bits(a), as_bits(b))
