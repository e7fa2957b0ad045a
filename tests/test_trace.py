"""carbon.trace: what a trace records (docs/trace.md).

Expectations are independent of the tracer: checksums are recomputed here with zlib from tensors
computed outside the trace, module paths and op sequences are written out by hand from the model
below (each layer has distinct sizes, so an op can be recognised by its shapes alone).
"""

import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import carbon
from carbon.diff import TraceReader


def crc(t: torch.Tensor) -> str:
    """The trace's checksum (docs/trace.md), recomputed from the tensor's values with zlib directly:
    CRC-32 of the row-major bytes, or beyond 1 MiB the CRC-32 of the 1 MiB chunks' CRC-32s."""
    b = t.detach().contiguous().numpy().tobytes()
    if len(b) <= 1 << 20:
        return f"{zlib.crc32(b):08x}"
    parts = [zlib.crc32(b[i:i + (1 << 20)]) for i in range(0, len(b), 1 << 20)]
    return f"{zlib.crc32(struct.pack(f'<{len(parts)}I', *parts)):08x}"


class MLP(torch.nn.Module):
    def __init__(self, d_in: int, d_hidden: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(d_in, d_hidden)
        self.act = torch.nn.Tanh()

    def forward(self, x):
        return self.act(self.fc(x))


class Block(torch.nn.Module):
    def __init__(self, d_in: int, d_hidden: int) -> None:
        super().__init__()
        self.mlp = MLP(d_in, d_hidden)

    def forward(self, x):
        return self.mlp(x)


class Net(torch.nn.Module):
    """blocks.0.mlp.fc: 3 -> 5, blocks.1.mlp.fc: 5 -> 7, out: 7 -> 2."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(3, 5), Block(5, 7)])
        self.out = torch.nn.Linear(7, 2)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def make(seed: int = 0):
    torch.manual_seed(seed)
    net = Net()
    x = torch.randn(4, 3)
    return net, x


def records(path):
    r = TraceReader(path)
    recs = list(r)
    r.close()
    return r.header, recs, r.footer


def train_step(net, x, opt):
    loss = net(x).square().mean()
    loss.backward()
    opt.step()
    return loss


def test_records_forward_backward_optimizer(tmp_path):
    net, x = make()
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    p = tmp_path / "t.jsonl"
    with carbon.trace(p) as tr:
        loss = train_step(net, x, opt)
    header, recs, footer = records(p)
    assert header["format"] == "carbon-trace" and header["save"] == "hash"
    assert footer["status"] == "ok" and footer["ops"] == len(recs) == tr.ops
    # forward of blocks.0.mlp.fc: a transpose of the 5x3 weight, then addmm (Linear on a 2-D input)
    assert [r["op"] for r in recs[:3]] == ["aten::t", "aten::addmm", "aten::tanh"]
    assert [r.get("module") for r in recs[:3]] == ["blocks.0.mlp.fc", "blocks.0.mlp.fc", "blocks.0.mlp.act"]
    assert recs[0]["in"][0][:2] == ["float32", [5, 3]]
    # backward ops exist and come after the forward ones; the optimizer's updates come last
    bwd = [i for i, r in enumerate(recs) if "bwd" in r]
    assert bwd and all("bwd" not in r for r in recs[: bwd[0]])
    last = recs[bwd[-1] + 1:]
    assert [r["op"] for r in last] == ["aten::add_.Tensor"] * 6  # SGD: one add_ per parameter tensor
    assert all(r["kwargs"] == {"alpha": -0.5} for r in last)
    names = ["blocks.0.mlp.fc.weight", "blocks.0.mlp.fc.bias", "blocks.1.mlp.fc.weight", "blocks.1.mlp.fc.bias",
             "out.weight", "out.bias"]
    assert [r["params"] for r in last] == [{"0": n} for n in names]  # the parameter each update writes
    # checksums, recomputed here: the input x, the loss, the updated parameters
    assert recs[1]["in"][1][2] == crc(x)
    mean = [r for r in recs if r["op"] == "aten::mean"]
    assert len(mean) == 1 and mean[0]["out"][0] == ["float32", [], crc(loss)]
    for r, prm in zip(last, net.parameters()):
        assert r["out"][0] == ["float32", list(prm.shape), crc(prm)]


def test_backward_ops_carry_forward_module_path(tmp_path):
    net, x = make()
    p = tmp_path / "t.jsonl"
    with carbon.trace(p):
        net(x).sum().backward()
    _, recs, _ = records(p)
    # the forward addmm of blocks.1.mlp.fc is the one reading its 7x5 weight (transposed: [5, 7])
    fwd = [r for r in recs if "bwd" not in r and r["op"] == "aten::addmm" and r["in"][2][1] == [5, 7]]
    assert len(fwd) == 1 and fwd[0]["module"] == "blocks.1.mlp.fc"
    # its backward: the weight gradient is an mm producing [7, 5] (before the transpose back) and
    # the bias gradient a sum over the batch producing [1, 7]
    grads = [r for r in recs if r.get("bwd") == "AddmmBackward0" and r.get("fwd") == fwd[0]["i"]]
    assert {r["op"] for r in grads} >= {"aten::mm", "aten::sum.dim_IntList"}
    assert all(r["module"] == "blocks.1.mlp.fc" for r in grads)
    assert any(r["op"] == "aten::mm" and r["out"][0][1] == [7, 5] for r in grads)
    # tanh's backward runs in blocks.1.mlp.act and reads tanh's output
    tb = [r for r in recs if r.get("bwd") == "TanhBackward0"]
    assert {r["module"] for r in tb} == {"blocks.0.mlp.act", "blocks.1.mlp.act"}
    # accumulating into .grad is attributed to the parameter's module
    acc = [r for r in recs if r.get("bwd", "").endswith("AccumulateGrad")]
    assert {r["module"] for r in acc} == {"blocks.0.mlp.fc", "blocks.1.mlp.fc", "out"}
    # every backward op of a module-created node points at a forward op of the same module
    for r in recs:
        if "fwd" in r:
            assert recs[r["fwd"]].get("module") == r.get("module")
            assert "bwd" not in recs[r["fwd"]]


def test_source_location_args_and_factory_ops(tmp_path):
    p = tmp_path / "t.jsonl"
    with carbon.trace(p):
        line = sys._getframe().f_lineno + 1
        y = torch.full((2, 3), 1.5).pow(3)
    _, recs, _ = records(p)
    assert [r["op"] for r in recs] == ["aten::full", "aten::pow.Tensor_Scalar"]
    full, pw = recs
    assert full["in"] == [] and full["args"] == [[2, 3], 1.5]
    assert pw["args"] == [{"$": 0}, 3]
    assert pw["out"][0] == ["float32", [2, 3], crc(y)]
    for r in recs:
        assert r["src"] == f"{__file__}:{line} in test_source_location_args_and_factory_ops"


def test_checksum_is_layout_independent(tmp_path):
    w = torch.randn(6, 4)
    big = torch.randn(5, 1 << 18)  # 5 MiB: the chunked checksum
    p = tmp_path / "t.jsonl"
    with carbon.trace(p):
        wt = w.t()  # a non-contiguous view
        wt.exp()
        big.t().reshape(-1).neg()  # transpose, then a copy (reshape of a non-contiguous tensor), then a view
    _, recs, _ = records(p)
    assert recs[0]["out"][0] == ["float32", [4, 6], crc(w.t().contiguous())]
    assert recs[1]["in"][0] == recs[0]["out"][0]
    assert [r["op"] for r in recs[2:]] == ["aten::t", "aten::clone", "aten::_unsafe_view", "aten::neg"]
    assert recs[2]["in"][0][2] == crc(big) and recs[2]["out"][0][2] == crc(big.t().contiguous())
    assert recs[4]["out"][0] == ["float32", [5 << 18], crc(big.t().reshape(-1))]
    assert recs[5]["out"][0][2] == crc(-big.t().reshape(-1))


def test_inputs_are_hashed_before_the_op_and_after_hidden_writes(tmp_path):
    a = torch.arange(4.0)
    p = tmp_path / "t.jsonl"
    with carbon.trace(p):
        a.add_(1)  # in place: the input record must show the value read, the output the value written
        a.data.mul_(2)  # through .data (a separate version counter): later reads must see it
        a.neg()
    _, recs, _ = records(p)
    assert recs[0]["in"][0][2] == crc(torch.arange(4.0))
    assert recs[0]["out"][0][2] == crc(torch.arange(4.0) + 1)
    neg = [r for r in recs if r["op"] == "aten::neg"]  # (.data itself is recorded as aten::detach)
    assert len(neg) == 1 and neg[0]["in"][0][2] == crc((torch.arange(4.0) + 1) * 2)


def test_uninitialized_memory_is_not_checksummed(tmp_path):
    p = tmp_path / "t.jsonl"
    with carbon.trace(p):
        e = torch.empty(4)
        e.t().fill_(2.0)  # a view of uninitialized memory, then a write through it
        e.neg()
    _, recs, _ = records(p)
    assert [r["op"] for r in recs] == ["aten::empty.memory_format", "aten::t", "aten::fill_.Scalar", "aten::neg"]
    assert recs[0]["out"][0][2] is None and recs[1]["out"][0][2] is None and recs[2]["in"][0][2] is None
    assert recs[2]["out"][0][2] == crc(torch.full((4,), 2.0)) == recs[3]["in"][0][2]


def test_tensors_sidecar_and_max_bytes(tmp_path):
    x = torch.randn(8, 8)
    p = tmp_path / "t.jsonl"
    with carbon.trace(p, save="tensors") as tr:
        y = x.exp()
        z = y.sin()
    assert tr.tensors_path == str(p) + ".tensors"
    _, recs, footer = records(p)
    raw = open(tr.tensors_path, "rb").read()
    for r, t in zip(recs, (y, z)):
        off = r["out"][0][3]
        assert raw[off:off + 256] == t.numpy().tobytes()
    assert footer["saved_bytes"] == 512 and footer["skipped_tensors"] == 0
    # a cap of 300 bytes holds the first 256-byte output only; checksums are still all recorded
    p2 = tmp_path / "u.jsonl"
    with carbon.trace(p2, save="tensors", max_bytes=300):
        x.exp().sin().cos()
    _, recs, footer = records(p2)
    assert [r["out"][0][3] for r in recs] == [0, None, None]
    assert all(r["out"][0][2] is not None for r in recs)
    assert os.path.getsize(str(p2) + ".tensors") == 256 and footer["skipped_tensors"] == 2


def test_exception_ends_the_trace_cleanly(tmp_path):
    p = tmp_path / "t.jsonl"
    with pytest.raises(RuntimeError):
        with carbon.trace(p):
            torch.ones(2).exp()
            torch.ones(2) @ torch.ones(3)  # shape error
    lines = [json.loads(s) for s in open(p)]
    assert lines[-1]["end"] is True and lines[-1]["status"].startswith("exception: RuntimeError")
    # the hooks and the mode are gone: nothing is recorded after the block
    assert torch.nn.modules.module._global_forward_hooks == {}
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    assert _get_current_dispatch_mode_stack() == []


def test_a_killed_run_leaves_a_readable_prefix(tmp_path):
    p = tmp_path / "t.jsonl"
    code = textwrap.dedent(f"""
        import os, torch, carbon
        t = carbon.trace({str(p)!r})
        t.__enter__()
        x = torch.ones(3)
        for _ in range(5):
            x = x * 2
        os._exit(3)  # no __exit__, no flush at exit
    """)
    rc = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.dirname(__file__))).returncode
    assert rc == 3
    r = TraceReader(p)
    recs = list(r)
    assert r.footer is None and [x["op"] for x in recs] == ["aten::ones"] + ["aten::mul.Tensor"] * 5
    assert recs[-1]["out"][0][2] == crc(torch.full((3,), 32.0))


def test_traces_do_not_nest(tmp_path):
    with carbon.trace(tmp_path / "a.jsonl"):
        with pytest.raises(RuntimeError, match="do not nest"):
            with carbon.trace(tmp_path / "b.jsonl"):
                pass


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="save"):
        carbon.trace(tmp_path / "a.jsonl", save="values")
    with pytest.raises(ValueError, match="max_bytes"):
        carbon.trace(tmp_path / "a.jsonl", max_bytes=-1)


class Counting(TorchDispatchMode):
    """Another dispatch mode (as carbon.enable is one): counts the ops it sees."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class CountingFunctions(TorchFunctionMode):
    """A function mode (carbon.enable is a function mode plus a dispatch mode): counts calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("trace_inside", [True, False])
def test_works_with_other_modes(tmp_path, trace_inside):
    net, x = make()

    def step():
        net.zero_grad()
        net(x).sum().backward()

    step()  # so that zero_grad has gradients to clear in both counted runs
    with CountingFunctions() as falone, Counting() as alone:
        step()
    p = tmp_path / "t.jsonl"
    if trace_inside:
        with CountingFunctions() as fother, Counting() as other, carbon.trace(p):
            step()
    else:
        with carbon.trace(p), CountingFunctions() as fother, Counting() as other:
            step()
    # the other modes see the model's ops and none of the trace's own work (copies, checksums)
    assert other.ops == alone.ops and fother.calls == falone.calls
    _, recs, _ = records(p)
    # and the trace records the same ops: "aten::add_.Tensor" is str(func) "aten.add_.Tensor",
    # "aten::addmm" is "aten.addmm.default"
    names = [r["op"].replace("::", ".") for r in recs]
    assert [n if n.count(".") == 2 else n + ".default" for n in names] == alone.ops


def test_carbon_ops_and_their_backward_carry_module_paths(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(carbon.nn.Linear(8, 4), carbon.nn.GELU(), carbon.nn.Linear(4, 2))
    p = tmp_path / "t.jsonl"
    with carbon.trace(p):
        m(torch.randn(3, 8)).sum().backward()
    _, recs, _ = records(p)
    fwd = [(r["op"], r["module"]) for r in recs if r["op"].startswith("carbon::") and "bwd" not in r]
    assert fwd == [("carbon::addmm", "0"), ("carbon::gelu", "1"), ("carbon::addmm", "2")]
    # the weight and input gradients of the last layer: carbon::mm in backward, attributed to "2"
    mm2 = [r for r in recs if r["op"] == "carbon::mm" and r.get("module") == "2"]
    assert len(mm2) >= 2 and all("bwd" in r and recs[r["fwd"]]["op"] == "carbon::addmm" for r in mm2)
    # the input gradient [3, 4], the [2, 4] weight's gradient (computed transposed, as [4, 2]) and the
    # bias gradient (a ones [1, 3] row times the [3, 2] output gradient)
    assert sorted(r["out"][0][1] for r in mm2) == [[1, 2], [3, 4], [4, 2]]


def test_other_threads_neither_recorded_nor_in_the_module_stack(tmp_path):
    import threading

    net, x = make()
    started, release = threading.Event(), threading.Event()

    class Slow(torch.nn.Module):
        def forward(self, y):
            started.set()
            release.wait(5)
            return y.exp()

    slow = torch.nn.Sequential(Slow())
    t = threading.Thread(target=lambda: slow(torch.ones(2)))
    p = tmp_path / "t.jsonl"
    with carbon.trace(p):
        t.start()
        started.wait(5)  # the other thread is now inside its modules
        net(x)
        release.set()
        t.join()
    _, recs, _ = records(p)
    assert "aten::exp" not in {r["op"] for r in recs}
    assert recs[0]["module"] == "blocks.0.mlp.fc"  # not nested under the other thread's Sequential
