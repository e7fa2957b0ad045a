"""carbon.enable(): run unmodified PyTorch code with Carbon's exact ops.

While enabled, on the calling thread (and in the autograd engine's threads
that run its backward passes):

* a :class:`~torch.utils._python_dispatch.TorchDispatchMode` reroutes the
  aten ops listed in :data:`carbon._enable_routes.ROUTES` — matmuls, sums and
  means, layer/RMS norm, softmax, elementwise math, indexed accumulation, the
  random ops, the foreach ops — to carbon's kernels or to fixed sequences of
  single IEEE operations, forward and backward alike (the backward of an aten
  op is made of aten ops, which the mode sees too);
* a :class:`~torch.overrides.TorchFunctionMode` sends the functions whose
  aten decompositions differ between devices (``F.cross_entropy``,
  ``F.scaled_dot_product_attention``, ``F.dropout``, ``F.rms_norm``,
  ``F.linear``, the norms and recurrent layers in :data:`_FUNCTIONS`) to
  carbon's versions as a whole (torch's fused attention kernels are switched
  off, so an attention that reaches aten by another path decomposes into
  routed ops);
* ``torch.optim.Adam/AdamW/SGD.step`` run carbon.optim's fused exact step
  (torch's own again after :func:`disable`, even through an LR scheduler's
  copy of the step);
* ``torch.distributed.all_reduce`` of floating tensors (SUM, AVG) is
  carbon.distributed.all_reduce: the correctly rounded exact sum or mean.

Every other aten op must be exact by construction — views, copies,
comparisons, one correctly rounded IEEE operation per element, integer
arithmetic (the allow-list in :mod:`carbon._enable_allow`). With
``strict=True`` an op outside both lists raises :class:`NotExactError`
naming it; with ``strict=False`` it runs as torch's op after one warning per
op. docs/enable.md lists every covered op and the definitions.

The random ops draw from ``carbon.default_generator`` (seeded by ``seed``), so
a model built on a GPU starts from the same weights as one built on the CPU.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import carbon
from carbon import _enable_allow, _enable_norms, _enable_rnn
from carbon._enable_routes import COMPLEX_ROUTES, FOREIGN_ROUTES, PASS, ROUTES, NotCovered, WithArguments

__all__ = ["enable", "disable", "enabled", "is_enabled", "NotExactError"]


class NotExactError(RuntimeError):
    """An op whose result could depend on the hardware, thread count or batch
    size ran while carbon was enabled with strict=True."""


_MISSING = object()
_schemas: Dict[Any, List[Tuple[str, Any]]] = {}


# c10::ScalarType codes, for schema defaults such as randint's dtype=long (given as ints)
_SCALAR_TYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
                 torch.float64, torch.complex32, torch.complex64, torch.complex128, torch.bool, torch.qint8,
                 torch.quint8, torch.qint32, torch.bfloat16)


def _default(argument: Any) -> Any:
    if not argument.has_default_value():
        return _MISSING
    value = argument.default_value
    if isinstance(value, int) and not isinstance(value, bool) and argument.name.endswith("dtype"):
        return _SCALAR_TYPES[value]
    return value


def _bind(func: Any, args: tuple, kwargs: dict) -> Dict[str, Any]:
    """The op's arguments by schema name, defaults filled in."""
    spec = _schemas.get(func)
    if spec is None:
        spec = [(a.name, _default(a)) for a in func._schema.arguments]
        _schemas[func] = spec
    bound: Dict[str, Any] = {}
    for i, (name, default) in enumerate(spec):
        if i < len(args):
            bound[name] = args[i]
        elif name in kwargs:
            bound[name] = kwargs[name]
        elif default is not _MISSING:
            bound[name] = default
    return bound


# Per op overload, what the dispatch mode asks of it on every call: (namespace, base name, in place?). Computed
# once (string work and schema reads cost microseconds per op, and a training step runs thousands of ops).
_op_facts: Dict[Any, Tuple[str, str, bool]] = {}


def _facts(func: Any) -> Tuple[str, str, bool]:
    facts = _op_facts.get(func)
    if facts is None:
        name = func.overloadpacket.__name__
        trailing = name.endswith("_") and not name.endswith("__")
        facts = (func.namespace, name[:-1] if trailing else name, trailing and func._schema.is_mutable)
        _op_facts[func] = facts
    return facts


def _base_name(func: Any) -> str:
    return _facts(func)[1]


def _is_inplace(func: Any) -> bool:
    return _facts(func)[2]


class _Session:
    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.warned: set = set()

    def not_covered(self, func: Any, why: str) -> None:
        """Raise (strict) or warn once about an op outside carbon's lists."""
        name = str(func)
        message = (f"carbon.enable: {name} is not covered ({why}); its result could depend on the device, the thread "
                   "count or the batch size. Run it outside carbon.enabled(), replace it with a covered op "
                   "(docs/enable.md lists them), or enable with strict=False to allow it with a warning.")
        if self.strict:
            raise NotExactError(message)
        if name not in self.warned:
            self.warned.add(name)
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def _route(base: str, bound: Dict[str, Any]) -> Any:
    """Run the routed op ``base`` on bound arguments; an op on the allow-list
    (used by the foreach handlers for sqrt, neg, ...) runs as torch's."""
    handler = ROUTES.get(base)
    if handler is None:
        if base not in _enable_allow.PER_TENSOR:
            raise NotCovered(f"per-tensor op {base}")
        return getattr(torch.ops.aten, base)(*bound.values())
    if getattr(handler, "takes_route", False):
        return handler(bound, _route)
    result = handler(bound)
    if result is PASS:
        return getattr(torch.ops.aten, base)(*bound.values())
    if isinstance(result, WithArguments):
        return getattr(torch.ops.aten, base)(*dict(bound, **result.updates).values())
    return result


class _DispatchMode(TorchDispatchMode):
    def __init__(self, session: _Session) -> None:
        super().__init__()
        self.session = session

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        namespace, base, _ = _facts(func)
        # Three lists, one way to use them: aten ops on real tensors; aten ops with complex arguments
        # (the real allow-list does not hold for them); other libraries' ops (carbon's own, profiler markers
        # and collectives pass).
        if namespace != "aten":
            handler, why_not = FOREIGN_ROUTES.get(f"{namespace}.{base}"), _enable_allow.why_not_foreign
        elif _enable_allow.has_complex(args, kwargs):
            handler, why_not = COMPLEX_ROUTES.get(base), _enable_allow.why_not_complex
        else:
            handler, why_not = ROUTES.get(base), _enable_allow.why_not_exact
        if handler is not None:
            try:
                return self._run(func, base, handler, args, kwargs)
            except (NotCovered, KeyError) as e:
                why = str(e) if isinstance(e, NotCovered) else f"this overload ({func._overloadname})"
                self.session.not_covered(func, why)
                return func(*args, **kwargs)
        why = why_not(func, base, args, kwargs)
        if why is _enable_allow.INTEGER_INPUTS:
            result = func(*args, **kwargs)
            why = _enable_allow.floating_result_of_integers(result)
            if why is not None:
                self.session.not_covered(func, why)
            return result
        if why is not None:
            decomposed = self._decompose(func, args, kwargs)
            if decomposed is not NotImplemented:
                return decomposed
            self.session.not_covered(func, why)
        return func(*args, **kwargs)

    def _decompose(self, func, args, kwargs):
        """Under torch.inference_mode no autograd key decomposes a CompositeImplicitAutograd op (aten.linear
        inside nn.TransformerEncoderLayer's inference path, say), so it reaches this mode whole: run its
        decomposition with the mode active again, so that its parts are routed. NotImplemented if it has none."""
        if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            return NotImplemented
        with self:
            return func.decompose(*args, **kwargs)

    @staticmethod
    def _run(func, base, handler, args, kwargs):
        bound = _bind(func, args, kwargs)
        if getattr(handler, "takes_route", False):
            result = handler(bound, _route)
        else:
            result = handler(bound)
        if result is PASS:
            return func(*args, **kwargs)
        if isinstance(result, WithArguments):
            return _call_with(func, dict(bound, **result.updates))
        if _is_inplace(func):
            target = bound["self"]
            if isinstance(target, (list, tuple)):
                for t, r in zip(target, result):
                    t.copy_(r)
                return None
            if isinstance(result, torch.Tensor) and not torch.can_cast(result.dtype, target.dtype):
                raise RuntimeError(f"result type {_type_name(result.dtype)} can't be cast to the desired output type "
                                   f"{_type_name(target.dtype)}")  # torch's own check (x.log_() of an int64 x)
            return target.copy_(result)
        out = bound.get("out")
        if out is not None and "out" in func._overloadname:
            if isinstance(result, torch.Tensor) and not torch.can_cast(result.dtype, out.dtype):
                raise RuntimeError(f"result type {_type_name(result.dtype)} can't be cast to the desired output type "
                                   f"{_type_name(out.dtype)}")
            out.resize_(result.shape).copy_(result)
            return out
        return result


def _call_with(func: Any, bound: Dict[str, Any]) -> Any:
    """func with bound arguments (schema names), keyword-only ones passed by keyword."""
    args, kwargs = [], {}
    for argument in func._schema.arguments:
        if argument.name in bound:
            if argument.kwarg_only:
                kwargs[argument.name] = bound[argument.name]
            else:
                args.append(bound[argument.name])
    return func(*args, **kwargs)


def _type_name(dtype: torch.dtype) -> str:
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
            torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
            torch.bool: "Bool"}.get(dtype, str(dtype))


def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    if (weight is not None or size_average is not None or reduce is not None or target.is_floating_point()
            or input.dtype not in (torch.float32, torch.bfloat16, torch.float16)):
        return None
    return carbon.cross_entropy(input, target, reduction, ignore_index, label_smoothing)


def _linear(input, weight, bias=None):
    """F.linear as carbon.linear for every input layout: torch decomposes it into addmm (bias inside the
    one rounding) for 2-d and contiguous 3-d inputs but into matmul + add (two roundings) otherwise, so
    the same rows would get other bits in another layout. Under autocast, torch's casts apply: fall through."""
    dtypes = {t.dtype for t in (input, weight, bias) if t is not None}
    if len(dtypes) != 1 or input.dtype not in (torch.float32, torch.bfloat16, torch.float16) or weight.dim() != 2:
        return None
    try:
        if torch.is_autocast_enabled(input.device.type):
            return None
    except TypeError:  # older torch: no device_type argument
        if torch.is_autocast_enabled():
            return None
    return carbon.linear(input, weight, bias)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    # Grouped or broadcast key/value heads (GQA, Falcon's multi-query attention) are copied out to one per
    # query head first (repeat_interleave, as torch's enable_gqa and Hugging Face's repeat_kv define them;
    # their gradient is an exact sum over each group), so every way of writing the same attention —
    # enable_gqa, repeat_kv, a mask or none — is carbon's one attention and gives the same bits.
    if query.dtype not in (torch.float32, torch.bfloat16, torch.float16) or query.dim() < 3:
        return None
    key, value = _heads_like(query, key, enable_gqa), _heads_like(query, value, enable_gqa)
    if key is None or value is None:
        return None
    return carbon.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)


def _heads_like(query, kv, enable_gqa):
    """kv with query's batch and head dimensions (None when they are not GQA-compatible or broadcastable)."""
    lead = list(query.shape[:-2])
    if enable_gqa and kv.dim() == query.dim() and kv.shape[-3] != query.shape[-3]:
        if query.shape[-3] % kv.shape[-3]:
            return None
        kv = kv.repeat_interleave(query.shape[-3] // kv.shape[-3], -3)
    if list(kv.shape[:-2]) != lead:
        try:
            kv = kv.expand(lead + list(kv.shape[-2:]))
        except RuntimeError:
            return None
    return kv


def _rms_norm(input, normalized_shape, weight=None, eps=None):
    if input.dtype not in (torch.float32, torch.bfloat16, torch.float16) or (eps is not None and not eps >= 0):
        return None  # torch's function then runs, its ops checked one by one
    return carbon.rms_norm(input, normalized_shape, weight, eps)


def _dropout(input, p=0.5, training=True, inplace=False):
    if input.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return None
    return carbon.dropout(input, p, training, inplace)


def _native_recurrence(x: torch.Tensor) -> bool:
    """Whether torch's own RNN code runs (on the CPU, with oneDNN off while enabled: routed ops); elsewhere the CPU's
    recurrence written out in carbon/_enable_rnn.py runs. (tests/test_enable_rnn.py switches it off on the CPU to
    compare the two.)"""
    return x.device.type == "cpu"


def _recurrent(func: Callable) -> Callable:
    """torch.lstm / gru / rnn_tanh / rnn_relu. On the CPU, a padded (not packed) input is made time-major and
    contiguous first: torch projects every step's input with at::linear, which takes addmm (bias inside the one
    rounding) for a contiguous time-major input but matmul + add for the transposed batch-first one of more than
    one sequence, so a sequence alone and in a batch got different bits. On other devices (cuDNN, or CUDA's
    fused cells, which add biases and products in their own order) the CPU's recurrence runs instead, op for op
    (carbon/_enable_rnn.py), padded or packed: the CPU's bits on every device."""
    kind = func.__name__

    def route(*args, **kwargs):
        if kwargs or len(args) != 9 or not isinstance(args[0], torch.Tensor):
            return None  # an unexpected call: torch's own (and its own error)
        packed = isinstance(args[1], torch.Tensor) and args[1].dim() == 1 and not args[1].is_floating_point()
        on_cpu = _native_recurrence(args[0])
        if packed:
            return None if on_cpu else _enable_rnn.recurrent(kind, args)  # 2-d data: already one addmm
        x, batch_first = args[0], args[8]
        if x.dim() != 3:
            return None
        time_major = (x.transpose(0, 1) if batch_first else x).contiguous()
        step_args = (time_major, *args[1:8], False)
        out = func(*step_args) if on_cpu else _enable_rnn.recurrent(kind, step_args)
        first = out[0].transpose(0, 1) if batch_first else out[0]
        return (first,) + tuple(out[1:])
    return route


def _recurrent_cell(func: Callable) -> Callable:
    """torch.lstm_cell / gru_cell / rnn_tanh_cell / rnn_relu_cell on another device than the CPU: the CPU's cell,
    op for op (carbon/_enable_rnn.py), instead of CUDA's fused cell kernels."""
    kind = func.__name__[:-len("_cell")]

    def route(*args, **kwargs):
        if kwargs or not 4 <= len(args) <= 6 or not isinstance(args[0], torch.Tensor) or _native_recurrence(args[0]):
            return None
        return _enable_rnn.cell(kind, args)
    return route


_FUNCTIONS: Dict[Callable, Callable] = {
    F.linear: _linear,
    F.cross_entropy: _cross_entropy,
    F.batch_norm: _enable_norms.batch_norm,
    F.group_norm: _enable_norms.group_norm,
    F.instance_norm: _enable_norms.instance_norm,
    torch._C._nn.scaled_dot_product_attention: _sdpa,
    F.dropout: _dropout,
    F.rms_norm: _rms_norm,
    **{f: _recurrent(f) for f in (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu)},
    **{f: _recurrent_cell(f) for f in (torch.lstm_cell, torch.gru_cell, torch.rnn_tanh_cell, torch.rnn_relu_cell)},
}


class _FunctionMode(TorchFunctionMode):
    """Whole-function routes for the few functions whose aten decompositions
    differ by device (CPU and CUDA pick different attention kernels, dropout
    and rms_norm paths) or cannot be made exact op by op (cross_entropy's
    mean over the rows that are not ignored)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        route = _FUNCTIONS.get(func)
        if route is not None:
            result = route(*args, **kwargs)
            if result is not None:
                return result
        return func(*args, **kwargs)


# ---- torch.optim: the step of carbon.optim on torch's optimizer objects -----------------------------------------

def _optimizer_patches() -> Dict[type, Callable]:
    """The ``step`` installed on torch's Adam, AdamW and SGD while enabled.

    It keeps torch's step hooks (wrapped by ``Optimizer.profile_hook_step``
    as torch wraps its own, and marked ``hooked`` so torch does not wrap it
    again), and it checks at each call whether carbon is still enabled: an
    LR scheduler copies ``opt.step`` onto the optimizer when it is created, so
    a step bound while enabled can be called after :func:`disable`, and then
    runs torch's own step."""
    from carbon import optim as carbon_optim

    def routed(torch_cls: type, carbon_step: Callable) -> Callable:
        # torch hooks carbon.optim's classes' own step when it builds one of them: no second layer then
        hooked = getattr(carbon_step, "hooked", False)
        hooked_carbon_step = carbon_step if hooked else torch.optim.Optimizer.profile_hook_step(carbon_step)

        def step(self, closure=None):
            if _active is None:
                return torch_cls.step(self, closure)  # torch's again: disable() restored it
            return hooked_carbon_step(self, closure)

        step.hooked = True  # type: ignore[attr-defined]
        return step

    return {torch.optim.Adam: routed(torch.optim.Adam, carbon_optim.Adam.step),
            torch.optim.AdamW: routed(torch.optim.AdamW, carbon_optim.Adam.step),
            torch.optim.SGD: routed(torch.optim.SGD, carbon_optim.SGD.step)}


def _stale_step_patches(session: _Session) -> Dict[Tuple[Any, str], Callable]:
    """torch's per-group update functions, which only torch's own step calls.
    Reaching one while enabled means a step bound before :func:`enable` (an
    LR scheduler created before enable() keeps the step it saw): its update
    would be torch's, whose bits differ by device, so it is refused (strict)
    or warned about once."""
    import torch.optim.adam as torch_adam
    import torch.optim.sgd as torch_sgd

    def refused(name: str, original: Callable) -> Callable:
        def update(*args, **kwargs):
            session.not_covered(
                f"torch.optim.{name}.step bound before carbon.enable()",
                "an LR scheduler created before enable() keeps torch's step; create the optimizer and its scheduler "
                "after enable(), or use carbon.optim")
            return original(*args, **kwargs)
        return update

    return {(torch_adam, "adam"): refused("Adam/AdamW", torch_adam.adam),
            (torch_sgd, "sgd"): refused("SGD", torch_sgd.sgd)}


# ---- torch.distributed.all_reduce: carbon's exact all-reduce for floating tensors ---------------------------------

class _CompletedWork:
    """What an async all_reduce returns when carbon ran it (already done)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result([self._tensor])
        return future


def _distributed_patches(session: _Session) -> Dict[Tuple[Any, str], Callable]:
    if not torch.distributed.is_available():
        return {}
    import torch.distributed as dist

    from carbon import distributed as exact

    original = dist.all_reduce

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        how = exact_op("all_reduce", tensor, op)
        if how is None:
            return original(tensor, op=op, group=group, async_op=async_op)
        exact.all_reduce(tensor, how, group)
        return _CompletedWork(tensor) if async_op else None

    original_rs, original_rst, original_reduce = dist.reduce_scatter, dist.reduce_scatter_tensor, dist.reduce

    def exact_op(name: str, tensor, op) -> Optional[Any]:
        """carbon's ReduceOp for a float SUM/AVG, None when torch's own is exact (integers, MAX, MIN)."""
        if not tensor.is_floating_point() or op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN):
            return None
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG) or tensor.dtype not in exact._DTYPES:
            session.not_covered(f"torch.distributed.{name}", f"op {op} on {tensor.dtype}: carbon reduces SUM and AVG "
                                "of float32, bfloat16 and float16 exactly")
            return None
        return exact.ReduceOp.AVG if op == dist.ReduceOp.AVG else exact.ReduceOp.SUM

    def exact_reduce_scatter(name: str, original_fn: Callable) -> Callable:
        def reduce_scatter(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
            how = exact_op(name, output, op)
            if how is None:
                return original_fn(output, input, op=op, group=group, async_op=async_op)
            exact.reduce_scatter(output, input, how, group)
            return _CompletedWork(output) if async_op else None
        return reduce_scatter

    reduce_scatter = exact_reduce_scatter("reduce_scatter", original_rs)  # input: a list of tensors
    reduce_scatter_tensor = exact_reduce_scatter("reduce_scatter_tensor", original_rst)  # input: one flat tensor

    def reduce(tensor, dst=None, op=dist.ReduceOp.SUM, group=None, async_op=False, group_dst=None):
        if exact_op("reduce", tensor, op) is not None:
            session.not_covered("torch.distributed.reduce", "a float reduction to one rank: use all_reduce (exact)")
        return original_reduce(tensor, dst, op=op, group=group, async_op=async_op, group_dst=group_dst)

    return {(dist, "all_reduce"): all_reduce, (dist, "reduce_scatter"): reduce_scatter,
            (dist, "reduce_scatter_tensor"): reduce_scatter_tensor, (dist, "reduce"): reduce}


# ---- torch.manual_seed also seeds carbon's generator --------------------------------------------------------------

def _seed_patches() -> Dict[Tuple[Any, str], Callable]:
    original = torch.manual_seed

    def manual_seed(seed):
        carbon.random.manual_seed(int(seed) % 2 ** 64)
        return original(seed)

    return {(torch, "manual_seed"): manual_seed, (torch.random, "manual_seed"): manual_seed}


# ---- global switches: fused attention kernels off, so attention decomposes into routed ops ------------------------

def _switch_settings() -> List[Tuple[Callable[[], Any], Callable[[Any], None], Any]]:
    """(get, set, value while enabled) for torch's global switches that pick fused
    attention kernels. With them off, every scaled_dot_product_attention that
    does not come through F.scaled_dot_product_attention itself (e.g. from
    nn.MultiheadAttention) runs torch's math decomposition — bmm, softmax,
    masking — whose ops are all routed."""
    cuda = torch.backends.cuda
    settings = [(cuda.flash_sdp_enabled, cuda.enable_flash_sdp, False),
                (cuda.mem_efficient_sdp_enabled, cuda.enable_mem_efficient_sdp, False),
                (cuda.math_sdp_enabled, cuda.enable_math_sdp, True)]
    if hasattr(cuda, "cudnn_sdp_enabled"):
        settings.append((cuda.cudnn_sdp_enabled, cuda.enable_cudnn_sdp, False))
    # oneDNN's CPU LSTM / GRU kernels (mkldnn_rnn_layer): without them, nn.LSTM and nn.GRU decompose into
    # matmuls, sigmoid and tanh, all routed. Every other op oneDNN would run is routed before it is chosen.
    if hasattr(torch._C, "_get_mkldnn_enabled"):
        settings.append((torch._C._get_mkldnn_enabled, torch._C._set_mkldnn_enabled, False))
    mha = getattr(torch.backends, "mha", None)
    if mha is not None and hasattr(mha, "set_fastpath_enabled"):
        settings.append((mha.get_fastpath_enabled, mha.set_fastpath_enabled, False))
    return settings


# ---- enable / disable ---------------------------------------------------------------------------------------------

_lock = threading.Lock()
_active: Optional[Tuple[_Session, _DispatchMode, _FunctionMode, Dict[Any, Any]]] = None


def is_enabled() -> bool:
    """Whether carbon.enable() is in effect."""
    return _active is not None


def enable(seed: Optional[int] = None, strict: bool = True) -> None:
    """Route PyTorch's own ops to Carbon's exact implementations until
    :func:`disable`.

    Args:
        seed: seeds ``carbon.default_generator``, from which torch's random
            ops (``rand``, ``randn``, ``randint``, ``randperm``, ``uniform_``,
            ``normal_``, ``bernoulli_``, dropout) draw while enabled. ``None``
            keeps the generator's current state.
        strict: raise :class:`NotExactError` for an op that carbon does not
            cover and that is not exact by construction; with False, warn once
            per op and run torch's version.

    Enabling again while enabled only updates ``strict`` (and reseeds when a
    seed is given). The modes are thread-local: enable from the thread that
    runs the model (autograd's backward threads inherit them).
    """
    global _active
    if seed is not None:
        carbon.random.manual_seed(seed)
    with _lock:
        if _active is not None:
            _active[0].strict = bool(strict)
            return
        session = _Session(bool(strict))
        function_mode = _FunctionMode()
        dispatch_mode = _DispatchMode(session)
        steps = _optimizer_patches()
        saved = {cls: cls.__dict__.get("step", _MISSING) for cls in steps}
        for cls, step in steps.items():
            cls.step = step
        for (owner, attr), fn in {**_distributed_patches(session), **_seed_patches(),
                                  **_stale_step_patches(session)}.items():
            saved[(owner, attr)] = getattr(owner, attr)
            setattr(owner, attr, fn)
        for get, set_, value in _switch_settings():
            saved[("setting", set_)] = get()
            set_(value)
        function_mode.__enter__()
        dispatch_mode.__enter__()
        _active = (session, dispatch_mode, function_mode, saved)


def disable() -> None:
    """Undo :func:`enable`: PyTorch's ops, random generators and optimizers
    behave exactly as before. Does nothing when not enabled."""
    global _active
    with _lock:
        if _active is None:
            return
        _, dispatch_mode, function_mode, saved = _active
        # exiting a mode pops the top of its stack: refuse while a mode entered after enable() is still on top,
        # rather than pop that one and leave carbon's in place
        on_top = (_get_current_dispatch_mode_stack()[-1:] == [dispatch_mode]
                  and _get_current_function_mode_stack()[-1:] == [function_mode])
        if not on_top:
            raise RuntimeError("carbon.disable: a torch dispatch or function mode entered after carbon.enable() is "
                               "still active; exit it first")
        dispatch_mode.__exit__(None, None, None)
        function_mode.__exit__(None, None, None)
        for key, value in saved.items():
            if isinstance(key, tuple) and key[0] == "setting":
                key[1](value)
            elif isinstance(key, tuple):  # (module, attribute) patched
                setattr(key[0], key[1], value)
            elif value is _MISSING:  # inherited (torch's AdamW steps with Adam.step)
                delattr(key, "step")
            else:
                key.step = value
        _active = None


@contextlib.contextmanager
def enabled(seed: Optional[int] = None, strict: bool = True) -> Iterator[None]:
    """``with carbon.enabled(seed=0):`` — :func:`enable` for the block, then
    :func:`disable` (or back to the previous strictness when already enabled)."""
    was = _active
    previous_strict = was[0].strict if was is not None else None
    enable(seed=seed, strict=strict)
    try:
        yield
    finally:
        if was is None:
            disable()
        else:
            was[0].strict = bool(previous_strict)
