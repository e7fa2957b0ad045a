"""Bit-exact optimizers: torch.optim.AdamW / Adam / SGD whose ``step`` runs
one fused Carbon op per parameter group (``torch.ops.carbon.adam_step_`` /
``sgd_step_``). Every update is the per-element formula of
docs/contract.md §12: fp64 operations in a fixed order, each state rounded
once to float32 and the parameter once to its own format, so the bits are
the same on every CPU and GPU at any thread count.

Constructors, ``param_groups``, ``state`` and ``state_dict()`` are torch's,
so a torch.optim state_dict loads into these classes and back. The states
(exp_avg, exp_avg_sq, AMSGrad's max_exp_avg_sq, momentum_buffer) are float32
for every parameter dtype (torch keeps them in the parameter's dtype);
``load_state_dict`` keeps saved float32 states float32 for bfloat16 / float16
parameters, so resuming is bit-exact for them too. The step count is ``state['step']``, a CPU float32
tensor as in torch; reading it on the host does not synchronize with a GPU.

Adam and AdamW take ``capturable=True`` as torch's do: the step count is then a float32 tensor on the
parameter's device, advanced there, and the kernel derives the bias corrections from it (and reads a tensor
``lr`` on the device), so ``torch.cuda.graph`` can capture ``step()`` and every replay is a correct step,
with the default path's bits. Without it, capturing an Adam step raises.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import struct

import torch
from torch import Tensor

from carbon.optim._layout import Aliases, state_like, write_back

__all__ = ["Adam", "AdamW", "SGD", "power"]


def power(base: float, exponent: int) -> float:
    """base**exponent in IEEE fp64 by binary exponentiation (contract §12):
    r = 1; b = base; for each bit of the exponent from the lowest: if set,
    r = r * b; then b = b * b. Python float multiplications only (no libm
    pow), so every machine computes the same value."""
    result, b, e = 1.0, float(base), int(exponent)
    while e:
        if e & 1:
            result = result * b
        b = b * b
        e >>= 1
    return result


def _scalar(name: str, value: Any) -> float:
    if isinstance(value, Tensor):
        if value.device.type != "cpu":
            raise ValueError(f"carbon.optim: {name} must be a Python float or a CPU tensor, got a tensor on {value.device}")
        return float(value.item())
    return float(value)


def _check_unsupported(cls: str, options: Dict[str, Any], implementation_flags: bool = True) -> None:
    """Refuse options carbon's step does not implement. ``foreach``/``fused``
    only pick an implementation; they are refused for carbon's own classes
    (to say the step is always fused) and ignored for torch's optimizer
    objects stepped under carbon.enable (implementation_flags=False)."""
    for key in ("differentiable",):
        if options.get(key):
            raise ValueError(f"carbon.optim.{cls}: {key}=True is not supported")
    for key in ("foreach", "fused") if implementation_flags else ():
        if options.get(key):
            raise ValueError(f"carbon.optim.{cls}: {key}=True is not supported (carbon's step is always one fused op "
                             f"per parameter group; leave {key}=None)")


def _closure_loss(closure: Optional[Callable[[], float]]) -> Optional[float]:
    """torch.optim's step(closure): re-evaluate the loss with gradients on."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _name_of(optimizer: Any) -> Tuple[str, bool]:
    """(name for messages, whether it is one of carbon's own classes)."""
    own = getattr(optimizer, "_name", None)
    return (own, True) if own is not None else (type(optimizer).__name__, False)


def _grad_of(cls: str, p: Tensor) -> Tensor:
    g = p.grad
    if g.is_sparse:
        raise ValueError(f"carbon.optim.{cls}: sparse gradients are not supported")
    return g


def _round_to_float32(x: float) -> float:
    """RN32(x) (struct's 'f' packing is C's (float) cast, round to nearest
    even)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (no CUDA
    initialized: nothing can be)."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _refuse_capture(name: str, why: str) -> None:
    if _capturing():
        raise RuntimeError(f"carbon.optim.{name}.step: CUDA graph capture is not supported here: {why}")


def _increment_step(state: Dict[str, Any]) -> int:
    """state['step'] += 1, as torch.optim does, and the new count. A float32
    step (torch's, and carbon's) is filled with RN32(step + 1) computed on the
    host: step + 1 is exact in a Python float, and fill_ rounds it to float32
    once, the same value as the tensor addition (IEEE addition is the rounded
    exact sum), at ~1/3 of the cost of the in-place add on a 0-dim tensor,
    which dominated the step's per-tensor overhead. The step is a CPU tensor
    (moved there once if loaded onto a device): no device synchronization."""
    step = state["step"]
    if isinstance(step, Tensor) and step.dtype == torch.float32 and step.device.type != "cpu":
        # torch.optim's load_state_dict puts a fused optimizer's step counts on the parameters' device;
        # the host needs t for the step's constants, so the count moves to the CPU once (one wait, at the
        # first step after loading) instead of being read back from the device at every step.
        step = state["step"] = step.cpu()
    if isinstance(step, Tensor) and step.dtype == torch.float32 and step.device.type == "cpu":
        new = _round_to_float32(step.item() + 1.0)
        step.fill_(new)
        return int(new)
    state["step"] += 1
    return int(state["step"].item())


def _float32_state(state: Dict[str, Any], key: str, p: Tensor) -> Tensor:
    """state[key] as a float32 tensor on p's device laid out like p (created as zeros; see _layout). A complex64
    parameter keeps complex64 states (torch.optim's format) and gets their float view: torch's step treats the real
    and imaginary parts as independent parameters, and so does carbon's."""
    dtype = torch.complex64 if p.is_complex() else torch.float32
    t = state[key] = state_like(p, dtype, state.get(key))
    return torch.view_as_real(t) if t.is_complex() else t


def _real_view(name: str, t: Tensor) -> Tensor:
    """A complex64 parameter or gradient as its float32 view [..., 2] (as torch.optim's _view_as_real)."""
    if not t.is_complex():
        return t
    if t.dtype != torch.complex64:
        raise TypeError(f"carbon.optim.{name}: a {t.dtype} parameter; carbon steps complex64 (float32 parts)")
    return torch.view_as_real(t)


class _KeepFloat32States:
    """load_state_dict as torch's, except that saved float32 states of
    bfloat16 / float16 parameters stay float32 (torch casts every floating
    state to the parameter's dtype, which would round carbon's states)."""

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:  # type: ignore[override]
        saved_state = state_dict["state"]
        super().load_state_dict(state_dict)  # type: ignore[misc]
        for group, saved_group in zip(self.param_groups, state_dict["param_groups"]):  # type: ignore[attr-defined]
            for p, pid in zip(group["params"], saved_group["params"]):
                saved = saved_state.get(pid)
                if saved is not None and p.dtype != torch.float32:
                    st = self.state[p]  # type: ignore[attr-defined]
                    for key, value in saved.items():
                        if key != "step" and isinstance(value, Tensor) and value.dtype == torch.float32:
                            st[key] = value.to(device=p.device)


class Adam(_KeepFloat32States, torch.optim.Adam):
    """torch.optim.Adam (L2 weight decay; decoupled with
    ``decoupled_weight_decay=True``; AMSGrad with ``amsgrad=True``) with a
    bit-exact fused step."""

    _name = "Adam"

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 amsgrad: bool = False, *, foreach: Optional[bool] = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False, fused: Optional[bool] = None,
                 decoupled_weight_decay: bool = False) -> None:
        _check_unsupported(self._name, dict(amsgrad=amsgrad, capturable=capturable, differentiable=differentiable,
                                            foreach=foreach, fused=fused))
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         foreach=foreach, maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=decoupled_weight_decay)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None):
        loss = _closure_loss(closure)
        name, own = _name_of(self)
        if not all(group.get("capturable", False) for group in self.param_groups):
            _refuse_capture(name, "the step count and the bias corrections are host values, so every replay would "
                                  "repeat the captured step's t; construct the optimizer with capturable=True (t and "
                                  "the bias corrections then live on the device), or call step() outside the graph")
        for group in self.param_groups:
            _check_unsupported(name, group, own)
            if group.get("capturable", False):
                _adam_capturable_group(name, self.state, group)
                continue
            lr = _scalar("lr", group["lr"])
            beta1, beta2 = (_scalar("beta1", b) for b in group["betas"])
            eps, wd = float(group["eps"]), _scalar("weight_decay", group["weight_decay"])
            decoupled = bool(group.get("decoupled_weight_decay", False))
            maximize = bool(group["maximize"])
            amsgrad = bool(group.get("amsgrad", False))
            # step -> (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs: empty without AMSGrad)
            by_step: Dict[int, List[List[Tensor]]] = {}
            aliases: List[Aliases] = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = _grad_of(name, p)
                state = self.state[p]
                if "step" not in state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                a = Aliases(_real_view(name, p))
                aliases.append(a)
                m = a.state(_float32_state(state, "exp_avg", p))
                v = a.state(_float32_state(state, "exp_avg_sq", p))
                t = _increment_step(state)
                lists = by_step.setdefault(t, [[], [], [], [], []])
                for lst, x in zip(lists, (a.param, a.read(_real_view(name, g)), m, v)):
                    lst.append(x)
                if amsgrad:  # torch's name; zeros when new, as torch creates it
                    lists[4].append(a.state(_float32_state(state, "max_exp_avg_sq", p)))
            for t, (ps, gs, ms, vs, ws) in by_step.items():
                bias_correction1 = 1.0 - power(beta1, t)
                bias_correction2_sqrt = math.sqrt(1.0 - power(beta2, t))
                torch.ops.carbon.adam_step_(ps, gs, ms, vs, ws, lr, beta1, beta2, eps, wd, bias_correction1,
                                            bias_correction2_sqrt, decoupled, maximize)
            write_back(aliases)
        return loss


def _adam_capturable_group(name: str, states: Dict[Tensor, Dict[str, Any]], group: Dict[str, Any]) -> None:
    """One parameter group of a capturable Adam / AdamW step (contract §12,
    "CUDA graphs"): each parameter's step count is a float32 tensor on its
    device (as torch's capturable=True keeps it), advanced in place by one
    and read, with a tensor learning rate, by the kernel itself. No host value
    changes from step to step, so a captured graph replays correct steps, and
    the bits equal those of the default path (the same constants, computed
    where the kernel runs)."""
    lr_value = group["lr"]
    lr, lr_tensor = (0.0, lr_value) if isinstance(lr_value, Tensor) else (float(lr_value), None)
    if lr_tensor is not None and lr_tensor.device.type == "cpu" and _capturing():
        raise RuntimeError(f"carbon.optim.{name}.step: lr is a CPU tensor, whose value a CUDA graph would fix at "
                           f"capture; put it on the parameters' device to change it between replays")
    beta1, beta2 = (_scalar("beta1", b) for b in group["betas"])
    eps, wd = float(group["eps"]), _scalar("weight_decay", group["weight_decay"])
    amsgrad = bool(group.get("amsgrad", False))
    lists: List[List[Tensor]] = [[], [], [], [], [], []]  # params, grads, exp_avgs, exp_avg_sqs, maxima, steps
    aliases: List[Aliases] = []
    for p in group["params"]:
        if p.grad is None:
            continue
        g = _grad_of(name, p)
        state = states[p]
        step = state.get("step")
        if step is None:
            step = torch.zeros((), dtype=torch.float32, device=p.device)
        elif not isinstance(step, Tensor) or step.dtype != torch.float32 or step.device != p.device:
            step = torch.as_tensor(step).to(device=p.device, dtype=torch.float32)
        state["step"] = step
        a = Aliases(_real_view(name, p))
        aliases.append(a)
        entries = [a.param, a.read(_real_view(name, g)), a.state(_float32_state(state, "exp_avg", p)),
                   a.state(_float32_state(state, "exp_avg_sq", p))]
        entries.append(a.state(_float32_state(state, "max_exp_avg_sq", p)) if amsgrad else None)
        entries.append(step)
        for lst, x in zip(lists, entries):
            if x is not None:
                lst.append(x)
    if not lists[0]:
        return
    ps, gs, ms, vs, ws, steps = lists
    # t + 1 is exact in float32 up to 2^24, where the default path's fill_ rounds the same way
    torch._foreach_add_(steps, 1.0)
    torch.ops.carbon.adam_step_capturable_(ps, gs, ms, vs, ws, steps, lr, lr_tensor, beta1, beta2, eps, wd,
                                           bool(group.get("decoupled_weight_decay", False)), bool(group["maximize"]))
    write_back(aliases)


class AdamW(_KeepFloat32States, torch.optim.AdamW):
    """torch.optim.AdamW (decoupled weight decay) with a bit-exact fused step."""

    _name = "AdamW"

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: bool = False, *, maximize: bool = False, foreach: Optional[bool] = None,
                 capturable: bool = False, differentiable: bool = False, fused: Optional[bool] = None) -> None:
        _check_unsupported(self._name, dict(amsgrad=amsgrad, capturable=capturable, differentiable=differentiable,
                                            foreach=foreach, fused=fused))
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, foreach=foreach, capturable=capturable, differentiable=differentiable,
                         fused=fused)

    step = Adam.step  # group["decoupled_weight_decay"] is True for AdamW


class SGD(_KeepFloat32States, torch.optim.SGD):
    """torch.optim.SGD (momentum, dampening, Nesterov, weight decay,
    maximize) with a bit-exact fused step."""

    _name = "SGD"

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0, dampening: float = 0, weight_decay: float = 0,
                 nesterov: bool = False, *, maximize: bool = False, foreach: Optional[bool] = None,
                 differentiable: bool = False, fused: Optional[bool] = None) -> None:
        _check_unsupported(self._name, dict(differentiable=differentiable, foreach=foreach, fused=fused))
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, maximize=maximize, foreach=foreach, differentiable=differentiable,
                         fused=fused)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None):
        loss = _closure_loss(closure)
        name, own = _name_of(self)
        for group in self.param_groups:
            _check_unsupported(name, group, own)
            lr, momentum = _scalar("lr", group["lr"]), float(group["momentum"])
            dampening, wd = float(group["dampening"]), _scalar("weight_decay", group["weight_decay"])
            nesterov, maximize = bool(group["nesterov"]), bool(group["maximize"])
            # first_step -> (params, grads, buffers)
            calls: Dict[bool, List[List[Tensor]]] = {False: [[], [], []], True: [[], [], []]}
            aliases: List[Aliases] = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = _grad_of(name, p)
                state = self.state[p]
                first = momentum != 0 and state.get("momentum_buffer") is None
                lists = calls[first]
                a = Aliases(_real_view(name, p))
                aliases.append(a)
                lists[0].append(a.param)
                lists[1].append(a.read(_real_view(name, g)))
                if momentum != 0:
                    lists[2].append(a.state(_float32_state(state, "momentum_buffer", p)))
            if calls[True][0]:
                _refuse_capture(name, "a momentum buffer is created on the first step, so every replay would "
                                      "repeat a first step; run one step() before capturing")
            for first, (ps, gs, bs) in calls.items():
                if ps:
                    torch.ops.carbon.sgd_step_(ps, gs, bs, lr, momentum, dampening, wd, nesterov, maximize, first)
            write_back(aliases)
        return loss
