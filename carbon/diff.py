"""Comparing two traces: ``python -m carbon diff A B`` and :func:`compare_devices`.

Two traces written by :func:`carbon.trace` (docs/trace.md) are aligned op by op (by index). The
report says how many ops matched, which op is the first whose outputs differ, whether that op's
inputs were identical in both runs (then the op itself produced different bits from the same
inputs: it is the source of the divergence) or not (then an input that no earlier traced op
produced differs: a parameter, buffer or input that was already different when tracing began), its
module path and source location and, when both runs saved tensors, how large the difference is (max
absolute difference, max difference in units in the last place, elements that differ). When the
two runs executed different ops (different control flow, a different kernel choice), the first
index where the op names differ is reported instead and the comparison stops there.

Exit codes of the command: 0 when the traces are identical, 1 when they differ, 2 when a trace
cannot be compared (unreadable, not a trace, cut off in the middle of a line, or traces of
incompatible formats), with a message saying which and why.
"""

from __future__ import annotations

import argparse
import collections
import copy
import html
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from carbon.tracing import FORMAT, FORMAT_VERSION, HASH_NAME, trace

__all__ = ["TraceError", "TraceReader", "TensorDiff", "OpDiff", "DiffResult", "diff_traces",
           "compare_devices", "main"]

_CONTEXT = 8  # ops shown on either side of the divergence in the text report
_HTML_WINDOW = 200  # ops kept on either side of the divergence for the HTML op table
_TIMELINE_CELLS = 600


class TraceError(Exception):
    """A trace that cannot be compared: unreadable, not a carbon trace, cut off mid-line, or
    incompatible with the other trace. ``python -m carbon diff`` exits with code 2."""


# ---------------------------------------------------------------------------------------------
# reading


class TraceReader:
    """Streams the op records of a trace file, checking its structure as it goes.

    ``header`` is read on construction. Iterating yields the op records in order; afterwards
    ``footer`` is the end record (None when the run did not reach the end of its ``with`` block:
    it crashed or is still running), ``count`` the number of op records and ``truncated`` whether
    a cut-off last line was dropped (only with ``allow_truncated=True``; otherwise that is a
    :class:`TraceError`).
    """

    def __init__(self, path: "os.PathLike[str] | str", allow_truncated: bool = False) -> None:
        self.path = os.fspath(path)
        self.allow_truncated = allow_truncated
        self.footer: Optional[Dict[str, Any]] = None
        self.count = 0
        self.truncated = False
        try:
            self._f = open(self.path, "rb")
        except OSError as e:
            raise TraceError(f"{self.path}: cannot open: {e.strerror or e}") from e
        first = self._f.readline()
        if not first:
            raise TraceError(f"{self.path}: empty file, not a carbon trace")
        try:
            header = json.loads(first)
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise TraceError(f"{self.path}: not a carbon trace (the first line is not a '{FORMAT}' header)")
        if header.get("version") != FORMAT_VERSION:
            raise TraceError(f"{self.path}: trace format version {header.get('version')!r}; this carbon "
                             f"reads version {FORMAT_VERSION}")
        if not first.endswith(b"\n"):
            raise TraceError(f"{self.path}: truncated: the file ends inside its header line")
        self.header: Dict[str, Any] = header
        self._line = 1

    def close(self) -> None:
        self._f.close()

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for raw in self._f:
            self._line += 1
            if self.footer is not None:
                raise TraceError(f"{self.path}: line {self._line}: data after the end record")
            complete = raw.endswith(b"\n")
            try:
                rec = json.loads(raw)
                ok = isinstance(rec, dict)
            except ValueError:
                ok = False
            if not ok or not complete:
                if not complete:
                    if self.allow_truncated:
                        self.truncated = True
                        return
                    raise TraceError(
                        f"{self.path}: truncated: line {self._line} is cut off after {self.count} complete "
                        f"op records (the run was killed while writing, or the file was cut). Pass "
                        f"--allow-truncated to compare the complete records before it.")
                raise TraceError(f"{self.path}: line {self._line} is not a valid trace record")
            if rec.get("end") is True:
                if rec.get("ops") != self.count:
                    raise TraceError(f"{self.path}: the end record counts {rec.get('ops')} ops but the file "
                                     f"holds {self.count}: records are missing")
                self.footer = rec
                continue
            if rec.get("i") != self.count or "op" not in rec:
                raise TraceError(f"{self.path}: line {self._line}: expected op record {self.count}, found "
                                 f"{str(rec)[:80]}")
            self.count += 1
            yield rec

    def tensors_file(self) -> Optional[str]:
        name = self.header.get("tensors")
        if not name:
            return None
        return os.path.join(os.path.dirname(os.path.abspath(self.path)), name)


def _check_compatible(a: TraceReader, b: TraceReader) -> None:
    for key in ("hash",):
        if a.header.get(key) != b.header.get(key):
            raise TraceError(f"the traces are not comparable: {key} {a.header.get(key)!r} in {a.path} but "
                             f"{b.header.get(key)!r} in {b.path}")
    if a.header.get("hash") != HASH_NAME:
        raise TraceError(f"{a.path}: checksum {a.header.get('hash')!r}; this carbon computes {HASH_NAME!r}")


# ---------------------------------------------------------------------------------------------
# comparing


@dataclass
class TensorDiff:
    """How one output tensor differs between the runs (from the saved values)."""

    slot: int
    dtype: str
    shape: List[int]
    numel: int
    differing: int  # elements whose bits differ
    max_abs: Optional[float]  # None for bool
    max_ulp: Optional[float]  # floating dtypes only; inf when a NaN meets a number
    nan_mismatch: int = 0

    def describe(self) -> str:
        s = f"output {self.slot} ({self.dtype}{self.shape}): {self.differing} of {self.numel} elements differ"
        if self.max_abs is not None:
            s += f", max abs diff {self.max_abs:.6g}"
        if self.max_ulp is not None:
            s += f", max ulp diff {self.max_ulp:.6g}"
        if self.nan_mismatch:
            s += f", {self.nan_mismatch} NaN in one run only"
        return s


@dataclass
class OpDiff:
    """One aligned op whose inputs or outputs differ."""

    index: int
    op: str
    module: Optional[str]
    mtype: Optional[str]
    src: Optional[str]
    backward: Optional[str]  # the autograd node running it, for backward ops
    forward_index: Optional[int]  # the forward op that created that node
    forward_op: Optional[str]
    inputs_identical: bool
    args_identical: bool  # non-tensor arguments (devices excepted)
    differing_inputs: List[Tuple[int, list, list]]
    differing_outputs: List[Tuple[int, Optional[list], Optional[list]]]
    tensor_diffs: List[TensorDiff] = field(default_factory=list)
    record_a: Dict[str, Any] = field(default_factory=dict)
    record_b: Dict[str, Any] = field(default_factory=dict)

    def where(self) -> str:
        mod = _module_label(self.record_a)
        s = f"op {self.index} {self.op} in {mod}"
        if self.backward:
            s += f", backward ({self.backward}"
            if self.forward_index is not None:
                s += f" of forward op {self.forward_index} {self.forward_op or ''}".rstrip()
            s += ")"
        return s


@dataclass
class Structural:
    """The first index where the two runs executed different ops."""

    index: int
    op_a: Optional[str]
    op_b: Optional[str]
    record_a: Optional[Dict[str, Any]]
    record_b: Optional[Dict[str, Any]]


@dataclass
class DiffResult:
    """The comparison of two traces (see :func:`diff_traces`)."""

    path_a: str
    path_b: str
    header_a: Dict[str, Any]
    header_b: Dict[str, Any]
    footer_a: Optional[Dict[str, Any]]
    footer_b: Optional[Dict[str, Any]]
    ops_a: int
    ops_b: int
    aligned: int  # ops compared pairwise (up to a structural divergence or the shorter end)
    matched: int  # leading ops identical in inputs and outputs
    same_outputs: int  # aligned ops whose outputs are identical
    first: Optional[OpDiff]  # first op whose outputs differ
    first_input: Optional[OpDiff]  # first op whose inputs differ (when it comes before ``first``)
    structural: Optional[Structural]
    truncated_a: bool = False
    truncated_b: bool = False
    notes: List[str] = field(default_factory=list)
    timeline: bytes = b""  # per aligned op: b'=' same, b'i' inputs differ only, b'o' outputs differ
    window: List[Tuple[int, Dict[str, Any], Dict[str, Any], str]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """Same ops, same inputs and outputs, same length, both runs complete."""
        return (self.structural is None and self.first is None and self.first_input is None
                and self.ops_a == self.ops_b and self.footer_a is not None and self.footer_b is not None
                and not self.truncated_a and not self.truncated_b)

    @property
    def exit_code(self) -> int:
        return 0 if self.identical else 1

    def report(self) -> str:
        """The human-readable report printed by ``python -m carbon diff``."""
        return _text_report(self)

    def to_html(self) -> str:
        """A self-contained HTML report (no external resources)."""
        return _html_report(self)


def _strip_devices(x: Any) -> Any:
    """A JSON argument with device values blanked: traces of two devices compare equal there."""
    if isinstance(x, dict):
        if "device" in x and len(x) == 1:
            return {"device": "*"}
        return {k: _strip_devices(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_strip_devices(v) for v in x]
    return x


def _desc_key(d: Optional[list]) -> Any:
    return None if d is None else (d[0], tuple(d[1]), d[2])


def _module_label(rec: Dict[str, Any]) -> str:
    if "module" not in rec:
        return "(no module)"
    m = rec.get("module") or ""
    t = rec.get("mtype") or "?"
    return f"{m} ({t})" if m else f"(top-level {t})"


def _compare_op(a: Dict[str, Any], b: Dict[str, Any]) -> Tuple[bool, bool, List[Tuple[int, list, list]],
                                                               List[Tuple[int, Optional[list], Optional[list]]]]:
    """(args identical, tensor inputs identical, differing inputs, differing outputs) of two records."""
    args_same = (_strip_devices(a.get("args")) == _strip_devices(b.get("args"))
                 and _strip_devices(a.get("kwargs")) == _strip_devices(b.get("kwargs")))
    ia, ib = a.get("in", []), b.get("in", [])
    din = [(k, x, y) for k, (x, y) in enumerate(zip(ia, ib)) if _desc_key(x) != _desc_key(y)]
    if len(ia) != len(ib):
        din.append((min(len(ia), len(ib)), ia[len(ib):] if len(ia) > len(ib) else [], ib[len(ia):]))
    oa, ob = a.get("out", []), b.get("out", [])
    dout: List[Tuple[int, Optional[list], Optional[list]]] = [
        (k, x, y) for k, (x, y) in enumerate(zip(oa, ob)) if _desc_key(x[:3]) != _desc_key(y[:3])]
    for k in range(min(len(oa), len(ob)), max(len(oa), len(ob))):
        dout.append((k, oa[k] if k < len(oa) else None, ob[k] if k < len(ob) else None))
    if _strip_devices(a.get("ret")) != _strip_devices(b.get("ret")) and not dout:
        dout.append((-1, None, None))  # a non-tensor result (e.g. .item()) differs
    return args_same, args_same and not din, din, dout


class _Sidecar:
    def __init__(self, path: Optional[str]) -> None:
        self.path = path
        self._f = None
        if path is not None and os.path.exists(path):
            self._f = open(path, "rb")

    def read(self, desc: list) -> Optional[torch.Tensor]:
        if self._f is None or len(desc) < 4 or desc[3] is None:
            return None
        dtype = getattr(torch, desc[0], None)
        if not isinstance(dtype, torch.dtype):
            return None
        shape = list(desc[1])
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        self._f.seek(desc[3])
        buf = self._f.read(nbytes)
        if len(buf) != nbytes:
            return None
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(buf), dtype=dtype).reshape(shape)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


_ORDERED_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def tensor_diff(slot: int, a: torch.Tensor, b: torch.Tensor) -> TensorDiff:
    """Compare two saved tensors of the same dtype and shape element by element.

    ``differing`` counts elements whose bits differ. ``max_abs`` is the largest absolute difference
    (in float64) over elements that are not NaN in either run. ``max_ulp`` (floating dtypes) is the
    largest distance between the two values counted in representable numbers of their format (+0
    and -0 count as the same point); ``inf`` when a NaN meets a non-NaN. Complex tensors are
    compared component by component.
    """
    dtype = str(a.dtype).replace("torch.", "")
    shape, numel = list(a.shape), a.numel()
    if a.is_complex():
        d = tensor_diff(slot, torch.view_as_real(a), torch.view_as_real(b))
        neq = (torch.view_as_real(a).view(_ORDERED_INT[a.element_size() // 2])
               != torch.view_as_real(b).view(_ORDERED_INT[a.element_size() // 2])).any(-1)
        return TensorDiff(slot, dtype, shape, numel, int(neq.sum()), d.max_abs, d.max_ulp, d.nan_mismatch)
    if a.dtype == torch.bool:
        return TensorDiff(slot, dtype, shape, numel, int((a != b).sum()), None, None)
    itype = _ORDERED_INT[a.element_size()]
    bits_a, bits_b = a.view(itype), b.view(itype)
    differing = int((bits_a != bits_b).sum())
    if not a.is_floating_point():
        absd = (a.to(torch.float64) - b.to(torch.float64)).abs()
        return TensorDiff(slot, dtype, shape, numel, differing, float(absd.max()) if numel else 0.0, None)
    af, bf = a.to(torch.float64), b.to(torch.float64)
    nan_a, nan_b = torch.isnan(af), torch.isnan(bf)
    nan_mismatch = int((nan_a ^ nan_b).sum())
    both = ~(nan_a | nan_b)
    absd = (af - bf).abs()[both]
    max_abs = float(absd.max()) if absd.numel() else 0.0
    if max_abs != max_abs:  # inf - inf: the same infinity never gets here (bits equal), opposite ones do
        max_abs = float("inf")
    # order-preserving map of bit patterns to integers: x >= +0 -> bits, x <= -0 -> -(bits without sign)
    low = (1 << (a.element_size() * 8 - 1)) - 1
    ia, ib = bits_a.to(torch.int64), bits_b.to(torch.int64)
    oa = torch.where(ia < 0, -(ia & low), ia)
    ob = torch.where(ib < 0, -(ib & low), ib)
    ulps = (oa.double() - ob.double()).abs()[both]
    max_ulp = float(ulps.max()) if ulps.numel() else 0.0
    if nan_mismatch:
        max_ulp = float("inf")
    return TensorDiff(slot, dtype, shape, numel, differing, max_abs, max_ulp, nan_mismatch)


def _summary(rec: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    if rec is None:
        return {}
    keep = ("i", "op", "module", "mtype", "src", "bwd", "fwd")
    s = {k: rec[k] for k in keep if k in rec}
    s["out"] = [d[:3] for d in rec.get("out", [])]
    return s


def diff_traces(path_a: "os.PathLike[str] | str", path_b: "os.PathLike[str] | str",
                allow_truncated: bool = False) -> DiffResult:
    """Compare two trace files; raises :class:`TraceError` when they cannot be compared.

    With ``allow_truncated``, a last line cut off mid-record (a run killed while writing) is
    dropped instead of being an error.
    """
    ra = TraceReader(path_a, allow_truncated)
    try:
        rb = TraceReader(path_b, allow_truncated)
    except BaseException:
        ra.close()
        raise
    try:
        return _diff(ra, rb)
    finally:
        ra.close()
        rb.close()


def _diff(ra: TraceReader, rb: TraceReader) -> DiffResult:
    _check_compatible(ra, rb)
    notes: List[str] = []
    ha, hb = ra.header, rb.header
    for key in ("torch", "carbon", "threads", "gpu", "machine"):
        if ha.get(key) != hb.get(key):
            notes.append(f"{key}: {ha.get(key)!r} in A, {hb.get(key)!r} in B")
    op_names: List[str] = []  # names of A's ops by index, to name the forward op of a backward op
    timeline = bytearray()
    before: Deque[Tuple[int, Dict[str, Any], Dict[str, Any], str]] = collections.deque(maxlen=_HTML_WINDOW)
    window: List[Tuple[int, Dict[str, Any], Dict[str, Any], str]] = []
    first: Optional[OpDiff] = None
    first_input: Optional[OpDiff] = None
    structural: Optional[Structural] = None
    matched = same_outputs = aligned = 0
    diverged_at: Optional[int] = None
    ia, ib = iter(ra), iter(rb)
    while True:
        a = next(ia, None)
        b = next(ib, None)
        if a is None or b is None:
            if (a is None) != (b is None):
                # one run executed more ops than the other
                structural = Structural(aligned, a and a["op"], b and b["op"], a, b)
                timeline.extend(b"!")
                for _ in (ib if a is None else ia):  # read to the end: count and structure checked
                    pass
            break
        i = aligned
        op_names.append(sys.intern(a["op"]))
        if a["op"] != b["op"]:
            structural = Structural(i, a["op"], b["op"], a, b)
            timeline.extend(b"!")
            for _ in ia:
                pass
            for _ in ib:
                pass
            break
        aligned += 1
        args_same, in_same, din, dout = _compare_op(a, b)
        status = "=" if in_same and not dout else ("o" if dout else "i")
        timeline.extend(status.encode())
        if not dout:
            same_outputs += 1
        if status != "=" and diverged_at is None:
            diverged_at = i
        if diverged_at is None:
            matched += 1
            before.append((i, _summary(a), _summary(b), status))
        elif len(window) < _HTML_WINDOW:
            window.append((i, _summary(a), _summary(b), status))
        if (not in_same) and first_input is None and first is None:
            first_input = _op_diff(i, a, b, args_same, in_same, din, dout, op_names)
        if dout and first is None:
            first = _op_diff(i, a, b, args_same, in_same, din, dout, op_names)
            _tensor_stats(first, ra, rb)
    if structural is not None:
        window.append((structural.index, _summary(structural.record_a), _summary(structural.record_b), "!"))
    if first_input is not None and first is not None and first_input.index == first.index:
        first_input = None
    if ra.footer is None:
        notes.append(f"A has no end record: that run stopped after {ra.count} ops (crashed or still running)")
    if rb.footer is None:
        notes.append(f"B has no end record: that run stopped after {rb.count} ops (crashed or still running)")
    for name, r in (("A", ra), ("B", rb)):
        if r.truncated:
            notes.append(f"{name}'s cut-off last line was dropped (--allow-truncated)")
        if r.footer is not None and r.footer.get("status") != "ok":
            notes.append(f"{name} ended with {r.footer.get('status')}")
    return DiffResult(ra.path, rb.path, ha, hb, ra.footer, rb.footer, ra.count, rb.count, aligned, matched,
                      same_outputs, first, first_input, structural, ra.truncated, rb.truncated, notes,
                      bytes(timeline), list(before) + window)


def _op_diff(i: int, a: Dict[str, Any], b: Dict[str, Any], args_same: bool, in_same: bool, din: list,
             dout: list, op_names: List[str]) -> OpDiff:
    fwd = a.get("fwd")
    return OpDiff(i, a["op"], a.get("module"), a.get("mtype"), a.get("src"), a.get("bwd"), fwd,
                  op_names[fwd] if isinstance(fwd, int) and 0 <= fwd < len(op_names) else None,
                  in_same, args_same, din, dout, [], a, b)


def _tensor_stats(d: OpDiff, ra: TraceReader, rb: TraceReader) -> None:
    sa, sb = _Sidecar(ra.tensors_file()), _Sidecar(rb.tensors_file())
    try:
        for slot, x, y in d.differing_outputs:
            if x is None or y is None or x[0] != y[0] or list(x[1]) != list(y[1]):
                continue
            ta, tb = sa.read(x), sb.read(y)
            if ta is None or tb is None:
                continue
            d.tensor_diffs.append(tensor_diff(slot, ta, tb))
    finally:
        sa.close()
        sb.close()


# ---------------------------------------------------------------------------------------------
# reports


def _fmt_desc(d: Optional[list]) -> str:
    if d is None:
        return "(none)"
    if d and isinstance(d[0], list):
        return ", ".join(_fmt_desc(x) for x in d) or "(none)"
    return f"{d[0]}{list(d[1])} #{d[2]}"


def _run_label(h: Dict[str, Any], f: Optional[Dict[str, Any]]) -> str:
    devs = ",".join(f.get("devices", [])) if f else "?"
    return (f"torch {h.get('torch')}, carbon {h.get('carbon')}, {h.get('threads')} threads, devices {devs or '-'}, "
            f"save={h.get('save')}")


def _text_report(r: DiffResult) -> str:
    out: List[str] = []
    w = out.append
    w(f"A: {r.path_a}  ({r.ops_a} ops; {_run_label(r.header_a, r.footer_a)})")
    w(f"B: {r.path_b}  ({r.ops_b} ops; {_run_label(r.header_b, r.footer_b)})")
    if r.identical:
        w(f"IDENTICAL: all {r.aligned} ops have the same inputs and outputs.")
        for n in r.notes:
            w(f"note: {n}")
        return "\n".join(out)
    w(f"DIFFERENT. Ops matched: {r.matched} of {r.aligned} compared (before the first difference); "
      f"{r.same_outputs} of {r.aligned} compared ops have identical outputs.")
    def heading(title: str, d) -> None:
        w("")
        w(f"{title}: {d.where()}")
        if d.src:
            w(f"  source: {d.src}")

    if r.first_input is not None:
        d = r.first_input
        heading("First op whose inputs differ (outputs still identical)", d)
        _describe_inputs(d, w)
    if r.first is not None:
        d = r.first
        heading("First divergence", d)
        if d.inputs_identical:
            w("  inputs: IDENTICAL in both runs -> this op itself produced different outputs from the same inputs")
        else:
            w("  inputs: differ -> an upstream cause (no earlier traced op produced a different value, so it was "
              "already different when tracing began, or changed outside the traced ops)")
            _describe_inputs(d, w)
        for slot, x, y in d.differing_outputs:
            if slot < 0:
                w(f"  non-tensor result: A {d.record_a.get('ret')!r}, B {d.record_b.get('ret')!r}")
            else:
                w(f"  output {slot}: A {_fmt_desc(x)}  B {_fmt_desc(y)}")
        for td in d.tensor_diffs:
            w(f"  {td.describe()}")
        if not d.tensor_diffs and any(s >= 0 for s, _, _ in d.differing_outputs):
            if r.header_a.get("save") == "tensors" and r.header_b.get("save") == "tensors":
                w("  (values of this output were not saved in both runs: max_bytes reached, or a sidecar file "
                  "is missing)")
            else:
                w("  (no saved values to measure the difference: trace both runs with save='tensors')")
    if r.structural is not None:
        s = r.structural
        w("")
        if s.op_a is None or s.op_b is None:
            longer = "B" if s.op_a is None else "A"
            rec = s.record_b if s.op_a is None else s.record_a
            w(f"Run {longer} executed more ops: A has {r.ops_a}, B has {r.ops_b}; the first extra op is "
              f"op {s.index} {(rec or {}).get('op')} in {_module_label(rec or {})}")
        else:
            w(f"Structural divergence at op {s.index}: A ran {s.op_a}, B ran {s.op_b} (different control flow or "
              f"kernel choice); ops after this point are not compared.")
            for name, rec in (("A", s.record_a), ("B", s.record_b)):
                rec = rec or {}
                w(f"  {name}: {rec.get('op')} in {_module_label(rec)}" + (f" at {rec['src']}" if rec.get("src") else ""))
    if r.first is not None:
        w("")
        w("Ops around the first divergence (= same, i = inputs differ, o = outputs differ):")
        idx = r.first.index
        for i, sa, _sb, st in r.window:
            if idx - _CONTEXT <= i <= idx + _CONTEXT:
                mark = ">>" if i == idx else "  "
                extra = f" [bwd {sa['bwd']}]" if sa.get("bwd") else ""
                w(f"  {mark} {st} {i:6d} {sa.get('op')} in {_module_label(sa)}{extra}")
    for n in r.notes:
        w(f"note: {n}")
    return "\n".join(out)


def _describe_inputs(d: OpDiff, w: Callable[[str], None]) -> None:
    if not d.args_identical:
        w(f"  non-tensor arguments differ: A {d.record_a.get('args')!r} {d.record_a.get('kwargs') or ''}, "
          f"B {d.record_b.get('args')!r} {d.record_b.get('kwargs') or ''}")
    for k, x, y in d.differing_inputs:
        w(f"  input {k}{_param_label(d, k)}: A {_fmt_desc(x)}  B {_fmt_desc(y)}")


def _param_label(d: OpDiff, k: int) -> str:
    name = (d.record_a.get("params") or {}).get(str(k)) or (d.record_b.get("params") or {}).get(str(k))
    return f" (parameter {name})" if name else ""


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
.verdict{padding:10px 14px;border-radius:6px;font-weight:600}
.same{background:#e6f4ea;color:#1e6b32} .diff{background:#fde8e8;color:#9b1c1c}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top;font-family:ui-monospace,monospace;font-size:12px}
th{background:#f4f4f4}
tr.st-o td{background:#fff1f1} tr.st-i td{background:#fff8e6} tr.st-x td{background:#f3e8ff}
tr.first td{background:#ffcccc;font-weight:700}
.tl{display:flex;height:28px;border:1px solid #ccc;margin:6px 0}
.tl span{flex:1;min-width:1px}
.c-eq{background:#5cb85c} .c-i{background:#f0ad4e} .c-o{background:#d9534f} .c-x{background:#7b3fa0}
.c-first{background:#000}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
"""


def _html_report(r: DiffResult) -> str:
    e = html.escape
    parts: List[str] = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>carbon diff</title>",
                        f"<style>{_CSS}</style></head><body>", "<h1>carbon diff</h1>"]
    p = parts.append
    p("<table><tr><th></th><th>trace</th><th>ops</th><th>run</th></tr>")
    for name, path, n, h, f in (("A", r.path_a, r.ops_a, r.header_a, r.footer_a),
                                ("B", r.path_b, r.ops_b, r.header_b, r.footer_b)):
        p(f"<tr><td>{name}</td><td>{e(path)}</td><td>{n}</td><td>{e(_run_label(h, f))}</td></tr>")
    p("</table>")
    if r.identical:
        p(f"<p class='verdict same'>Identical: all {r.aligned} ops have the same inputs and outputs.</p>")
    else:
        p(f"<p class='verdict diff'>Different: {r.matched} of {r.aligned} compared ops matched before the first "
          f"difference.</p>")
    text = _text_report(r)
    if r.first is not None:
        d = r.first
        p("<h2>First divergence</h2><table>")
        rows = [("op", f"{d.index} {d.op}"), ("module", _module_label(d.record_a)),
                ("source", d.src or "-")]
        if d.backward:
            rows.append(("backward of", f"{d.backward}, forward op {d.forward_index} {d.forward_op or ''}"))
        rows.append(("inputs", "identical: this op itself diverged" if d.inputs_identical
                     else "differ: upstream cause"))
        for k, x, y in d.differing_inputs:
            rows.append((f"input {k}{_param_label(d, k)}", f"A {_fmt_desc(x)} / B {_fmt_desc(y)}"))
        for slot, x, y in d.differing_outputs:
            rows.append((f"output {slot}", f"A {_fmt_desc(x)} / B {_fmt_desc(y)}"))
        for td in d.tensor_diffs:
            rows.append((f"values {td.slot}", td.describe()))
        for k, v in rows:
            p(f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>")
        p("</table>")
    # timeline: buckets of ops, colored by the worst status in the bucket
    tl = r.timeline
    if tl:
        n = len(tl)
        cells = min(n, _TIMELINE_CELLS)
        p("<h2>Op timeline</h2><div class='tl'>")
        rank = {ord("="): 0, ord("i"): 1, ord("o"): 2, ord("!"): 3}
        cls = {0: "c-eq", 1: "c-i", 2: "c-o", 3: "c-x"}
        first_idx = r.first.index if r.first is not None else (r.structural.index if r.structural else None)
        for c in range(cells):
            lo, hi = c * n // cells, max(c * n // cells + 1, (c + 1) * n // cells)
            worst = max(rank.get(x, 0) for x in tl[lo:hi])
            k = cls[worst]
            if first_idx is not None and lo <= first_idx < hi:
                k = "c-first"
            p(f"<span class='{k}' title='ops {lo}-{hi - 1}'></span>")
        p("</div><div class='legend'><span class='c-eq'></span>identical<span class='c-i'></span>inputs differ"
          "<span class='c-o'></span>outputs differ<span class='c-x'></span>different op"
          "<span class='c-first'></span>first divergence</div>")
    if r.window:
        p("<h2>Ops around the first difference</h2><table><tr><th>#</th><th>status</th><th>op</th><th>module</th>"
          "<th>backward</th><th>source</th><th>outputs A</th><th>outputs B</th></tr>")
        first_idx = r.first.index if r.first is not None else None
        labels = {"=": "same", "i": "inputs differ", "o": "outputs differ", "!": "different op"}
        for i, sa, sb, st in r.window:
            rc = "first" if i == first_idx else {"=": "", "i": "st-i", "o": "st-o", "!": "st-x"}[st]
            op = sa.get("op") if st != "!" else f"{sa.get('op')} / {sb.get('op')}"
            p(f"<tr class='{rc}'><td>{i}</td><td>{labels[st]}</td><td>{e(str(op))}</td>"
              f"<td>{e(_module_label(sa))}</td><td>{e(str(sa.get('bwd') or ''))}</td><td>{e(str(sa.get('src') or ''))}</td>"
              f"<td>{e(_fmt_desc(sa.get('out')))}</td><td>{e(_fmt_desc(sb.get('out')))}</td></tr>")
        p("</table>")
    p(f"<h2>Text report</h2><pre>{e(text)}</pre></body></html>")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# compare_devices


def _to_device(x: Any, device: str, memo: Dict[int, Any]) -> Any:
    if id(x) in memo:
        return memo[id(x)]
    if isinstance(x, torch.nn.Module):
        y: Any = copy.deepcopy(x).to(device)
    elif isinstance(x, torch.Tensor):
        y = x.detach().clone().to(device)
        if x.requires_grad:
            y.requires_grad_(True)
    elif isinstance(x, (list, tuple)):
        y = type(x)(_to_device(v, device, memo) for v in x) if not hasattr(x, "_fields") else \
            type(x)(*(_to_device(v, device, memo) for v in x))
    elif isinstance(x, dict):
        y = type(x)((k, _to_device(v, device, memo)) for k, v in x.items())
    else:
        y = x
    memo[id(x)] = y
    return y


def compare_devices(fn: Callable[..., Any], *args: Any, devices: Sequence[str] = ("cpu", "cuda"),
                    save: str = "tensors", max_bytes: int = 1 << 28, verbose: bool = True,
                    workdir: "os.PathLike[str] | str | None" = None, **kwargs: Any) -> DiffResult:
    """Run ``fn(*args, **kwargs)`` once per device, traced, and compare the two traces.

    Tensor and module arguments (also inside lists, tuples and dicts) are copied to each device
    (modules with ``copy.deepcopy(m).to(device)``; tensors keep ``requires_grad``); anything
    ``fn`` reaches otherwise (globals, closures) is not moved. The CPU random number generator is
    put back to the same state before each run, so two runs on the CPU draw the same numbers; CUDA
    draws different numbers than the CPU — seed a device-independent generator (e.g.
    ``carbon.Generator``) inside ``fn`` or avoid randomness. Returns the :class:`DiffResult`
    (``result.first`` is the first divergent op) and prints its report when ``verbose``. The
    traces are written to ``workdir`` when given (kept), else to a temporary directory (removed).
    """
    if len(devices) != 2:
        raise ValueError(f"compare_devices: give exactly two devices, got {devices!r}")
    for dev in devices:
        if torch.device(dev).type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"compare_devices: device {dev!r} requested but CUDA is not available")
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="carbon-diff-")
        workdir = tmp.name
    workdir = os.fspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    try:
        rng = torch.get_rng_state()
        paths = []
        for k, dev in enumerate(devices):
            memo: Dict[int, Any] = {}
            dargs = _to_device(args, dev, memo)
            dkwargs = _to_device(kwargs, dev, memo)
            path = os.path.join(workdir, f"{k}-{str(dev).replace(':', '_')}.jsonl")
            torch.set_rng_state(rng)
            with trace(path, save=save, max_bytes=max_bytes):
                fn(*dargs, **dkwargs)
            if torch.device(dev).type == "cuda":
                torch.cuda.synchronize()
            paths.append(path)
        result = diff_traces(paths[0], paths[1])
        if verbose:
            print(result.report())
        return result
    finally:
        if tmp is not None:
            tmp.cleanup()


# ---------------------------------------------------------------------------------------------
# command line


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m carbon diff A B [--html report.html] [--allow-truncated]``; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m carbon diff",
        description="Compare two traces written by carbon.trace and report the first op whose outputs differ. "
                    "Exit code: 0 identical, 1 different, 2 error.")
    parser.add_argument("a", help="first trace (JSON Lines written by carbon.trace)")
    parser.add_argument("b", help="second trace")
    parser.add_argument("--html", metavar="REPORT.html", help="also write a self-contained HTML report")
    parser.add_argument("--allow-truncated", action="store_true",
                        help="compare the complete records of a trace whose last line is cut off instead of failing")
    args = parser.parse_args(argv)
    try:
        result = diff_traces(args.a, args.b, allow_truncated=args.allow_truncated)
    except TraceError as e:
        print(f"carbon diff: error: {e}", file=sys.stderr)
        return 2
    try:
        print(result.report())
    except BrokenPipeError:  # e.g. piped into head
        pass
    if args.html:
        try:
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(result.to_html())
        except OSError as e:
            print(f"carbon diff: error: cannot write {args.html}: {e.strerror or e}", file=sys.stderr)
            return 2
        try:
            print(f"HTML report: {args.html}")
        except BrokenPipeError:
            pass
    return result.exit_code
