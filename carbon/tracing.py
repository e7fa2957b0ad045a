"""Recording a run op by op: ``with carbon.trace(path): ...``.

Every aten op executed inside the block — forward, backward and optimizer, factory ops included —
is written to ``path`` as one JSON line, in execution order, with:

* the op name (``aten::addmm``, ``aten::add.Tensor``, ``carbon::mm`` ...);
* the module path it ran in (``blocks.1.mlp.fc``), also for backward ops (the path of the forward op
  that created the autograd node), and the index of that forward op;
* the Python source location that called it (for backward ops: that of their forward op);
* the non-tensor arguments (scalars, shapes, dtypes, strings);
* which inputs are parameters of a module seen so far, by name (``blocks.1.mlp.fc.weight``);
* dtype, shape and a checksum of every tensor input (taken before the op runs, so in-place ops show
  what they read) and every tensor output;
* with ``save="tensors"``, the output values, in a sidecar file ``<path>.tensors`` capped at
  ``max_bytes``.

The format is specified in docs/trace.md. ``python -m carbon diff A B`` (carbon/diff.py) compares
two traces.

How it works: a :class:`torch.utils._python_dispatch.TorchDispatchMode` sees every op at the aten
level, below autograd, so it sees the ops autograd runs in backward and those an optimizer runs as
well as the ones the model calls. Global forward pre/post hooks on ``torch.nn.Module`` keep the
stack of modules that are running. A backward op is attributed through the autograd graph: each
autograd node gets a sequence number when created (``torch.autograd._get_sequence_nr``); the trace
remembers which forward op created which numbers, and in backward looks up the node being executed
(``torch._C._current_autograd_node()``).

Checksums are computed on the raw bytes of a contiguous CPU copy of each tensor, so the same values
on the CPU and on a GPU give the same checksum; for a CUDA tensor that copy synchronizes the device
at every op — this is a debugging tool, not something to leave on in training.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import datetime
import functools
import json
import math
import os
import platform
import struct
import sys
import threading
import weakref
import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

__all__ = ["trace", "Trace", "FORMAT", "FORMAT_VERSION", "HASH_NAME", "checksum", "tensor_bytes"]

FORMAT = "carbon-trace"
FORMAT_VERSION = 1
HASH_NAME = "crc32/1MiB"
DEFAULT_MAX_BYTES = 1 << 30
_ACCUMULATE_GRAD_SEQ = (1 << 64) - 1  # the sequence number of AccumulateGrad nodes (UINT64_MAX)
_SKIP_NAMESPACES = frozenset({"profiler"})  # record_function markers, not computation
# ops whose outputs are uninitialized memory: their values (and those of views of them, until
# something writes them) are not checksummed, since they differ from run to run
# views whose row-major element order is that of their input: their values are the input's bytes
_SAME_BYTES_VIEWS = frozenset({"aten::view", "aten::_unsafe_view", "aten::reshape", "aten::detach", "aten::alias",
                               "aten::unsqueeze", "aten::squeeze", "aten::flatten", "aten::_reshape_alias"})
_UNINIT_OPS = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                         "aten::new_empty_strided", "aten::empty_permuted"})

_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_active_lock = threading.Lock()
_active: Optional["Trace"] = None


def tensor_bytes(t: torch.Tensor) -> Any:
    """The raw bytes of ``t``'s values, row-major, as a 1-D ``uint8`` numpy array.

    A contiguous CPU copy is taken when needed (for a CUDA tensor that synchronizes the device).
    Conjugate and negative views are resolved first, so the bytes are those of the values the
    tensor stands for.
    """
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    t = t.contiguous()
    if t.device.type != "cpu":
        t = t.to("cpu")
    flat = t.reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    return flat.numpy()


def checksum(buf: Any) -> str:
    """The trace's checksum of a byte buffer (``HASH_NAME`` = ``"crc32/1MiB"``), 8 hex digits.

    Up to 1 MiB: the CRC-32 (IEEE, as ``zlib.crc32``) of the bytes. Longer: the buffer is cut into
    1 MiB chunks (the last one shorter), and the checksum is the CRC-32 of the chunks' CRC-32s, each
    as 4 little-endian bytes. The chunks are checksummed in parallel threads (zlib releases the GIL).

    CRC-32 detects every change confined to 32 consecutive bits — in particular any single element
    of 4 bytes or fewer that differs, e.g. by one ulp — and two different buffers of the same dtype
    and shape have the same checksum with probability about 2^-32 otherwise. Not cryptographic.
    """
    n = len(buf)
    if n <= _CHUNK:
        return f"{zlib.crc32(buf) & 0xFFFFFFFF:08x}"
    mv = memoryview(buf).cast("B")
    chunks = [mv[i:i + _CHUNK] for i in range(0, n, _CHUNK)]
    crcs = list(_pool().map(zlib.crc32, chunks)) if len(chunks) >= 4 else [zlib.crc32(c) for c in chunks]
    return f"{zlib.crc32(struct.pack(f'<{len(crcs)}I', *crcs)) & 0xFFFFFFFF:08x}"


_CHUNK = 1 << 20
_POOL: Optional[concurrent.futures.ThreadPoolExecutor] = None


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1),
                                                      thread_name_prefix="carbon-trace-crc")
    return _POOL


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _hashable(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and t.device.type != "meta" and not t.is_quantized


@dataclass
class _ModuleFrame:
    module: torch.nn.Module
    path: str
    mtype: str


class _Mode(TorchDispatchMode):
    """The dispatch mode that reports every op to its :class:`Trace`."""

    def __init__(self, owner: "Trace") -> None:
        super().__init__()
        self._owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        owner = self._owner
        if func.namespace in _SKIP_NAMESPACES:
            return func(*args, **kwargs)
        pre = owner._before(func, args, kwargs)
        out = func(*args, **kwargs)
        owner._after(func, pre, out)
        return out


class _Pre:
    """What :meth:`Trace._before` learnt about an op before it ran."""

    __slots__ = ("args", "kwargs", "ins", "params", "node", "seq")

    def __init__(self, args: Any, kwargs: Any, ins: List[list], params: Optional[Dict[str, str]], node: Any,
                 seq: Optional[int]) -> None:
        self.args, self.kwargs, self.ins, self.params, self.node, self.seq = args, kwargs, ins, params, node, seq


class Trace:
    """A recording in progress (or finished); create it with :func:`carbon.trace`.

    Attributes after the block: ``path``, ``tensors_path`` (or None), ``ops`` (ops recorded),
    ``saved_bytes`` (bytes in the sidecar), ``skipped_tensors`` (outputs not saved because of
    ``max_bytes``).
    """

    def __init__(self, path: "os.PathLike[str] | str", save: str = "hash", max_bytes: int = DEFAULT_MAX_BYTES,
                 *, source: bool = True) -> None:
        if save not in ("hash", "tensors"):
            raise ValueError(f"carbon.trace: save must be 'hash' or 'tensors', got {save!r}")
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"carbon.trace: max_bytes must be a non-negative int, got {max_bytes!r}")
        self.path = os.fspath(path)
        self.save = save
        self.max_bytes = max_bytes
        self.tensors_path: Optional[str] = self.path + ".tensors" if save == "tensors" else None
        self._source = source
        self.ops = 0
        self.saved_bytes = 0
        self.skipped_tensors = 0
        self._fd: Optional[int] = None
        self._tfd: Optional[int] = None
        self._mode: Optional[_Mode] = None
        self._hooks: List[Any] = []
        self._stack: List[_ModuleFrame] = []
        self._child_names: Dict[Tuple[int, int], str] = {}
        self._seen_modules: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
        self._param_paths: Dict[int, Tuple[Any, str, str, str]] = {}  # id -> (weakref, module, mtype, name)
        self._seq_starts: List[int] = []
        self._seq_info: List[Tuple[int, str, str, Optional[str]]] = []  # (op index, module, mtype, src)
        self._last_seq = 0
        self._cache: Dict[int, Tuple[Any, int, int, str]] = {}  # id -> (weakref, version, storage, hash)
        self._by_storage: Dict[int, set] = {}
        self._writes: Dict[Any, Tuple[int, ...]] = {}  # op -> indices of arguments it writes
        self._devices: set = set()
        self._thread_id: Optional[int] = None
        self._internal_code: Dict[Any, bool] = {}
        self._internal_dirs = tuple(
            os.path.join(os.path.dirname(os.path.abspath(f)), "") for f in (torch.__file__, __file__)
        )

    # ---- context manager -------------------------------------------------------------------
    def __enter__(self) -> "Trace":
        global _active
        with _active_lock:
            if _active is not None:
                raise RuntimeError("carbon.trace: a trace is already recording; traces do not nest")
            _active = self
        try:
            self._open()
        except BaseException:
            with _active_lock:
                _active = None
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        global _active
        try:
            self._close(exc_type, exc)
        finally:
            with _active_lock:
                _active = None

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        if self.tensors_path is not None:
            self._tfd = os.open(self.tensors_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._write_line(self._header())
        self._thread_id = threading.get_ident()
        self._last_seq = torch.autograd._get_sequence_nr()
        mm = torch.nn.modules.module
        self._hooks = [
            mm.register_module_forward_pre_hook(self._pre_hook),
            mm.register_module_forward_hook(self._post_hook, always_call=True),
        ]
        self._mode = _Mode(self)
        self._mode.__enter__()

    def _close(self, exc_type: Any, exc: Any) -> None:
        try:
            if self._mode is not None:
                self._mode.__exit__(None, None, None)
        finally:
            self._mode = None
            for h in self._hooks:
                h.remove()
            self._hooks = []
            if self._fd is not None:
                status = "ok" if exc_type is None else f"exception: {exc_type.__name__}: {exc}"
                end = {"end": True, "ops": self.ops, "status": status,
                       "devices": sorted(self._devices), "saved_bytes": self.saved_bytes,
                       "skipped_tensors": self.skipped_tensors}
                try:
                    self._write_line(end)
                finally:
                    os.close(self._fd)
                    self._fd = None
            if self._tfd is not None:
                os.close(self._tfd)
                self._tfd = None
            self._cache.clear()
            self._by_storage.clear()

    def _header(self) -> Dict[str, Any]:
        gpu = None
        if torch.cuda.is_available():
            try:
                gpu = torch.cuda.get_device_name()
            except Exception:  # pragma: no cover - a broken driver must not stop the trace
                gpu = "unknown"
        return {
            "format": FORMAT, "version": FORMAT_VERSION, "save": self.save, "hash": HASH_NAME,
            "max_bytes": self.max_bytes,
            "tensors": os.path.basename(self.tensors_path) if self.tensors_path else None,
            "byteorder": sys.byteorder, "torch": torch.__version__,
            "carbon": getattr(sys.modules.get("carbon"), "__version__", None), "python": platform.python_version(),
            "platform": platform.platform(), "machine": platform.machine(),
            "threads": torch.get_num_threads(), "cuda": torch.version.cuda, "gpu": gpu,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": list(sys.argv),
        }

    def _write_line(self, obj: Dict[str, Any]) -> None:
        data = (_ENCODER.encode(obj) + "\n").encode()
        assert self._fd is not None
        # One write(2) per line, unbuffered: when the process dies, every line written so far is
        # complete on disk (the kernel keeps it), so a crash leaves a usable prefix.
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    # ---- module stack ------------------------------------------------------------------------
    def _child_name(self, parent: torch.nn.Module, child: torch.nn.Module) -> str:
        key = (id(parent), id(child))
        name = self._child_names.get(key)
        if name is not None:
            try:
                if parent.get_submodule(name) is child:
                    return name
            except AttributeError:
                pass
        for n, m in parent._modules.items():
            if m is child:
                self._child_names[key] = n
                return n
        for n, m in parent.named_modules():
            if m is child and n:
                self._child_names[key] = n
                return n
        return f"<{type(child).__name__}>"  # called by a module that does not own it

    def _pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        if threading.get_ident() != self._thread_id:
            return  # the hooks are global, the dispatch mode (and so the trace) is per thread
        if self._stack:
            parent = self._stack[-1]
            name = self._child_name(parent.module, module)
            path = f"{parent.path}.{name}" if parent.path else name
        else:
            path = ""
        mtype = type(module).__name__
        self._stack.append(_ModuleFrame(module, path, mtype))
        if module not in self._seen_modules:
            self._seen_modules.add(module)
            for pname, p in module._parameters.items():
                if p is not None and id(p) not in self._param_paths:
                    self._param_paths[id(p)] = (weakref.ref(p), path, mtype, pname)

    def _post_hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() != self._thread_id:
            return
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i].module is module:
                del self._stack[i:]
                return

    # ---- source locations ----------------------------------------------------------------------
    def _source_location(self) -> Optional[str]:
        if not self._source:
            return None
        try:
            f: Any = sys._getframe(3)
        except ValueError:  # called straight from C++ (e.g. an autograd worker thread)
            return None
        cache = self._internal_code
        while f is not None:
            code = f.f_code
            internal = cache.get(code)
            if internal is None:
                fn = code.co_filename
                internal = fn.startswith(self._internal_dirs) or fn.startswith("<frozen")
                cache[code] = internal
            if not internal:
                return f"{code.co_filename}:{f.f_lineno} in {code.co_name}"
            f = f.f_back
        return None

    # ---- checksums -----------------------------------------------------------------------------
    def _evict(self, key: int, ref: Any) -> None:
        ent = self._cache.get(key)
        if ent is not None and ent[0] is ref:
            del self._cache[key]
            ids = self._by_storage.get(ent[2])
            if ids is not None:
                ids.discard(key)
                if not ids:
                    del self._by_storage[ent[2]]

    def _invalidate_storage(self, t: torch.Tensor) -> None:
        try:
            sp = t.untyped_storage().data_ptr()
        except Exception:
            return
        for key in self._by_storage.pop(sp, ()):
            self._cache.pop(key, None)

    def _hash(self, t: torch.Tensor) -> Optional[str]:
        """Checksum of ``t``'s values, cached per tensor object and version counter."""
        if not _hashable(t):
            return None
        key = id(t)
        version = t._version
        ent = self._cache.get(key)
        if ent is not None and ent[1] == version and ent[0]() is t:
            return ent[3]
        try:
            h = checksum(tensor_bytes(t))
        except Exception:  # a tensor whose bytes cannot be read (an exotic subclass): not checksummed
            return None
        return self._remember(t, h)

    def _remember(self, t: torch.Tensor, h: Optional[str]) -> Optional[str]:
        """Cache ``h`` as the checksum of ``t`` at its current version; returns ``h``."""
        key = id(t)
        version = t._version
        ent = self._cache.get(key)
        try:
            ref = weakref.ref(t, functools.partial(self._evict, key))
            sp = t.untyped_storage().data_ptr()
        except (TypeError, RuntimeError):
            return h
        if ent is not None:
            self._evict(key, ent[0])
        self._cache[key] = (ref, version, sp, h)
        self._by_storage.setdefault(sp, set()).add(key)
        return h

    def _mark_uninit(self, t: torch.Tensor) -> None:
        """Remember that ``t`` holds uninitialized memory (checksum None) until its next write."""
        return self._remember(t, None)

    def _written_args(self, func: Any) -> Tuple[int, ...]:
        w = self._writes.get(func)
        if w is None:
            w = tuple(i for i, a in enumerate(func._schema.arguments)
                      if a.alias_info is not None and a.alias_info.is_write)
            self._writes[func] = w
        return w

    # ---- encoding ----------------------------------------------------------------------------
    def _encode(self, x: Any, tensors: List[torch.Tensor]) -> Any:
        """JSON form of an op argument or result; tensors become ``{"$": k}`` and go to ``tensors``."""
        if isinstance(x, torch.Tensor):
            tensors.append(x)
            return {"$": len(tensors) - 1}
        if x is None or isinstance(x, (bool, int, str)):
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"float": repr(x)}
        if isinstance(x, (list, tuple)):
            return [self._encode(v, tensors) for v in x]
        if isinstance(x, dict):
            return {str(k): self._encode(v, tensors) for k, v in x.items()}
        if isinstance(x, torch.dtype):
            return str(x)
        if isinstance(x, torch.device):
            return {"device": str(x)}
        if isinstance(x, (torch.layout, torch.memory_format)):
            return str(x)
        if isinstance(x, complex):
            return {"complex": [repr(x.real), repr(x.imag)]}
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return str(x)
        return {"object": type(x).__name__}

    def _describe(self, t: torch.Tensor, h: Optional[str]) -> list:
        self._devices.add(str(t.device))
        return [_dtype_name(t.dtype), list(t.shape), h]

    # ---- the per-op work -----------------------------------------------------------------------
    def _before(self, func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> _Pre:
        node = torch._C._current_autograd_node()
        seq = None if node is not None else torch.autograd._get_sequence_nr()
        with _quiet():
            tensors: List[torch.Tensor] = []
            eargs = self._encode(list(args), tensors)
            ekw = self._encode(kwargs, tensors) if kwargs else None
            ins = [self._describe(t, self._hash(t)) for t in tensors]
            params = None
            if self._param_paths:
                for k, t in enumerate(tensors):
                    ent = self._param_paths.get(id(t))
                    if ent is not None and ent[0]() is t:
                        if params is None:
                            params = {}
                        params[str(k)] = f"{ent[1]}.{ent[3]}" if ent[1] else ent[3]
            for i in self._written_args(func):
                if i < len(args) and isinstance(args[i], torch.Tensor):
                    self._invalidate_storage(args[i])
            if "out" in kwargs and isinstance(kwargs["out"], torch.Tensor):
                self._invalidate_storage(kwargs["out"])
        return _Pre(eargs, ekw, ins, params, node, seq)

    def _after(self, func: Any, pre: _Pre, out: Any) -> None:
        with _quiet():
            index = self.ops
            schema = func._schema
            name = schema.name if not schema.overload_name else f"{schema.name}.{schema.overload_name}"
            rec: Dict[str, Any] = {"i": index, "op": name}
            if pre.node is not None:
                # backward: module and source of the forward op that created this autograd node
                rec["bwd"] = pre.node.name()
                module, mtype, src, fwd = self._backward_origin(pre.node)
                if fwd is not None:
                    rec["fwd"] = fwd
            else:
                if self._stack:
                    frame = self._stack[-1]
                    module, mtype = frame.path, frame.mtype
                else:
                    module, mtype = None, None
                src = self._source_location()
                if pre.seq is not None and pre.seq > self._last_seq:
                    self._seq_starts.append(self._last_seq)
                    self._seq_info.append((index, module or "", mtype or "", src))
                    self._last_seq = pre.seq
            if module is not None:
                rec["module"] = module
                rec["mtype"] = mtype
            if src is not None:
                rec["src"] = src
            rec["args"] = pre.args
            if pre.kwargs:
                rec["kwargs"] = pre.kwargs
            rec["in"] = pre.ins
            if pre.params:
                rec["params"] = pre.params
            outs: List[torch.Tensor] = []
            ret = self._encode(out, outs)
            if not _plain_tensor_result(out):
                rec["ret"] = ret
            # outputs of empty-like ops, and views of a tensor not checksummed, stay unchecksummed
            uninit = schema.name in _UNINIT_OPS or (bool(pre.ins) and pre.ins[0][2] is None and _is_view(func))
            same_bytes = (schema.name in _SAME_BYTES_VIEWS and len(outs) == 1 and len(pre.ins) >= 1
                          and pre.ins[0][2] is not None and outs[0].dtype == _desc_dtype(pre.ins[0]))
            descs = []
            for t in outs:
                if uninit:
                    h = self._mark_uninit(t)
                elif same_bytes:
                    h = self._remember(t, pre.ins[0][2])
                else:
                    h = self._hash(t)
                d = self._describe(t, h)
                if self._tfd is not None:
                    d.append(self._save_tensor(t))
                descs.append(d)
            rec["out"] = descs
            self._write_line(rec)
            self.ops += 1

    def _backward_origin(self, node: Any) -> Tuple[Optional[str], Optional[str], Optional[str], Optional[int]]:
        """(module path, module type, source, forward op index) of the op that created ``node``."""
        try:
            sn = node._sequence_nr()
        except Exception:
            return None, None, None, None
        if sn == _ACCUMULATE_GRAD_SEQ:
            var = getattr(node, "variable", None)
            ent = self._param_paths.get(id(var)) if var is not None else None
            if ent is not None and ent[0]() is var:
                return ent[1], ent[2], None, None
            return None, None, None, None
        i = bisect.bisect_right(self._seq_starts, sn) - 1
        if i < 0 or sn >= self._last_seq:
            return None, None, None, None  # created before the trace started (or untracked)
        fwd, module, mtype, src = self._seq_info[i]
        return (module if mtype else None), (mtype or None), src, fwd

    def _save_tensor(self, t: torch.Tensor) -> Optional[int]:
        """Append ``t``'s bytes to the sidecar; its offset, or None when over ``max_bytes``."""
        if not _hashable(t):
            return None
        nbytes = t.numel() * t.element_size()
        if self.saved_bytes + nbytes > self.max_bytes:
            self.skipped_tensors += 1
            return None
        try:
            buf = memoryview(tensor_bytes(t))
        except Exception:
            return None
        offset = self.saved_bytes
        assert self._tfd is not None
        while buf:
            n = os.write(self._tfd, buf)
            buf = buf[n:]
        self.saved_bytes += nbytes
        return offset


def _desc_dtype(desc: list) -> Optional[torch.dtype]:
    """The torch dtype of a trace tensor description ``[dtype name, shape, checksum, ...]``."""
    d = getattr(torch, desc[0], None)
    return d if isinstance(d, torch.dtype) else None


def _is_view(func: Any) -> bool:
    rets = func._schema.returns
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def _plain_tensor_result(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return True
    return isinstance(out, (tuple, list)) and len(out) > 0 and all(isinstance(o, torch.Tensor) for o in out)


class _quiet:
    """Run the trace's own tensor work (copies, views, ``.numpy()``) unseen by any other Python
    dispatch or function mode (e.g. ``carbon.enable``) that is active below the trace."""

    __slots__ = ("_ctxs",)

    def __enter__(self) -> None:
        self._ctxs = []
        if torch._C._len_torch_dispatch_stack() > 0:
            self._ctxs.append(_disable_current_modes())
        if torch._C._is_torch_function_mode_enabled():
            self._ctxs.append(torch._C.DisableTorchFunction())
        for c in self._ctxs:
            c.__enter__()

    def __exit__(self, *exc: Any) -> None:
        for c in reversed(self._ctxs):
            c.__exit__(*exc)


def trace(path: "os.PathLike[str] | str", save: str = "hash", max_bytes: int = DEFAULT_MAX_BYTES,
          *, source: bool = True) -> Trace:
    """Record every aten op run inside the ``with`` block to the trace file ``path``.

    Args:
        path: the trace file (JSON Lines, docs/trace.md); overwritten.
        save: ``"hash"`` records a checksum of every input and output; ``"tensors"`` also writes the
            output values to ``<path>.tensors``, so that ``carbon diff`` can report the size of a
            difference (max abs / ulp difference, elements that differ).
        max_bytes: cap on the size of ``<path>.tensors``; outputs past it are not saved (their
            checksums still are). Default 1 GiB.
        source: record the Python source location of each op (walking the stack costs a little).

    Returns a :class:`Trace` context manager::

        with carbon.trace("run.jsonl"):
            loss = model(x).sum(); loss.backward(); opt.step()

    Traces do not nest. On a CUDA tensor every checksum copies to the host and synchronizes.
    """
    return Trace(path, save=save, max_bytes=max_bytes, source=source)
