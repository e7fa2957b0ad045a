"""python -m carbon diff and carbon.diff.compare_devices.

The expected divergences are set up by hand (one weight nudged by one ulp) or checked
independently before tracing (torch's CPU sum gives different bits at 1 and 2 threads for the tensor
used here; the matmul before it does not), then the report must name them.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

import carbon
from carbon.diff import compare_devices, diff_traces, main as diff_main
from test_trace import make, records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trace_step(path, net, x, save="tensors"):
    with carbon.trace(path, save=save):
        net(x).square().mean().backward()


def test_one_ulp_nudge_names_the_layer(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    net, x = make()
    trace_step(a, net, x)
    net, x = make()
    w = net.blocks[1].mlp.fc.weight
    old = w.detach()[2, 3].clone()
    with torch.no_grad():
        w[2, 3] = torch.nextafter(old, torch.tensor(float("inf")))
    step = float(w.detach()[2, 3] - old)  # one ulp of that weight
    trace_step(b, net, x)
    r = diff_traces(a, b)
    assert not r.identical and r.exit_code == 1 and r.structural is None
    d = r.first
    # the first op of blocks.1.mlp.fc (Linear on a 2-D input: transpose the weight, then addmm)
    assert (d.op, d.module, d.mtype) == ("aten::t", "blocks.1.mlp.fc", "Linear")
    # everything upstream of it matched, and it read the nudged weight: inputs not identical
    assert r.first_input is None and r.matched == d.index
    assert not d.inputs_identical and d.args_identical
    assert [k for k, _, _ in d.differing_inputs] == [0] and d.differing_inputs[0][1][:2] == ["float32", [7, 5]]
    # the transposed weight differs in one element by exactly that one ulp
    (td,) = d.tensor_diffs
    assert (td.differing, td.max_ulp, td.max_abs) == (1, 1.0, step)
    text = r.report()
    assert f"First divergence: op {d.index} aten::t in blocks.1.mlp.fc (Linear)" in text
    assert "upstream cause" in text and "input 0 (parameter blocks.1.mlp.fc.weight)" in text


class Head(torch.nn.Module):
    def forward(self, y):
        return y.sum()


class SumModel(torch.nn.Module):
    """Linear(64, 256) -> sum over all outputs (4096 x 256 of them for the input below)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 256)
        self.head = Head()

    def forward(self, x):
        return self.head(self.proj(x))


@pytest.fixture
def sum_model(restore_num_threads):
    """The model and input, after checking that torch's CPU sum differs at 1 and 2 threads on them
    while the matmul before it does not; returns (model, x, sum at 1 thread, sum at 2 threads)."""
    torch.manual_seed(1)
    model = SumModel()
    x = torch.randn(4096, 64)
    y, s = {}, {}
    with torch.no_grad():
        for n in (1, 2):
            torch.set_num_threads(n)
            y[n] = model.proj(x)
            s[n] = y[1].sum()  # the same input at both thread counts
    if not torch.equal(y[1], y[2]) or torch.equal(s[1], s[2]):
        pytest.skip("on this build the matmul differs or the sum does not differ between 1 and 2 threads")
    return model, x, float(s[1]), float(s[2])


@pytest.fixture
def two_thread_traces(tmp_path, sum_model):
    """Traces of SumModel forward and backward at 1 and 2 CPU threads, plain PyTorch."""
    model, x, s1, s2 = sum_model
    paths = []
    for n in (1, 2):
        torch.set_num_threads(n)
        model.zero_grad(set_to_none=True)
        p = tmp_path / f"t{n}.jsonl"
        with carbon.trace(p, save="tensors", max_bytes=1 << 23):
            model(x).backward()
        paths.append(p)
    return paths, s1, s2


def test_thread_count_divergence_in_plain_pytorch(two_thread_traces):
    (a, b), s1, s2 = two_thread_traces
    r = diff_traces(a, b)
    d = r.first
    assert (d.op, d.module) == ("aten::sum", "head")
    assert d.inputs_identical and r.first_input is None and r.matched == d.index
    (td,) = d.tensor_diffs
    assert td.differing == 1 and td.max_abs == abs(s1 - s2) and td.max_ulp >= 1
    assert "IDENTICAL in both runs" in r.report()
    assert any("threads: 1 in A, 2 in B" in n for n in r.notes)


@pytest.mark.parametrize("trace_outside", [False, True])
def test_same_model_under_carbon_enable_is_identical_across_threads(tmp_path, sum_model, trace_outside):
    model, x, _, _ = sum_model  # plain torch gives different sums at 1 and 2 threads (checked there)
    paths = []
    for n in (1, 2):
        torch.set_num_threads(n)
        model.zero_grad(set_to_none=True)
        p = tmp_path / f"t{n}.jsonl"
        if trace_outside:  # the trace sees carbon's kernels
            with carbon.trace(p), carbon.enabled(seed=0):
                model(x).backward()
        else:  # the trace sees torch's ops, computed by carbon
            with carbon.enabled(seed=0), carbon.trace(p):
                model(x).backward()
        paths.append(p)
    r = diff_traces(*paths)
    assert r.identical and r.aligned > 10
    _, recs, _ = records(paths[0])
    sums = [rec["op"] for rec in recs if rec.get("module") == "head" and "bwd" not in rec]
    assert sums == (["carbon::sum"] if trace_outside else ["aten::sum"])


def test_cli_exit_codes_identical_and_different(tmp_path, capsys):
    net, x = make()
    a, b, c = (tmp_path / f"{n}.jsonl" for n in "abc")
    trace_step(a, net, x, save="hash")
    trace_step(b, *make(), save="hash")
    trace_step(c, *make(seed=1), save="hash")
    assert diff_main([str(a), str(b)]) == 0
    assert "IDENTICAL" in capsys.readouterr().out
    assert diff_main([str(a), str(c)]) == 1
    # the real command line, exit status included
    run = subprocess.run([sys.executable, "-m", "carbon", "diff", str(a), str(c)], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 1 and "First divergence" in run.stdout


def test_truncated_and_mismatched_traces_exit_2(tmp_path, capsys):
    net, x = make()
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    trace_step(a, net, x, save="hash")
    lines = open(a, "rb").read().splitlines(keepends=True)

    def write(name, data):
        p = tmp_path / name
        p.write_bytes(data)
        return str(p)

    cut = write("cut.jsonl", b"".join(lines[:10]) + lines[10][: len(lines[10]) // 2])
    assert diff_main([str(a), cut]) == 2
    err = capsys.readouterr().err
    assert "truncated" in err and "line 11" in err and "--allow-truncated" in err
    # the complete records before the cut are usable: they match, but B stopped early
    assert diff_main([str(a), cut, "--allow-truncated"]) == 1
    out = capsys.readouterr().out
    assert "Ops matched: 9 of 9" in out and "no end record" in out

    not_trace = write("x.jsonl", b'{"hello": 1}\n')
    assert diff_main([str(a), not_trace]) == 2
    assert "not a carbon trace" in capsys.readouterr().err
    header = json.loads(lines[0])
    v2 = write("v2.jsonl", json.dumps({**header, "version": 99}).encode() + b"\n" + b"".join(lines[1:]))
    assert diff_main([str(a), v2]) == 2
    assert "version 99" in capsys.readouterr().err
    other_hash = write("h.jsonl", json.dumps({**header, "hash": "sha256"}).encode() + b"\n" + b"".join(lines[1:]))
    assert diff_main([str(a), other_hash]) == 2
    assert "not comparable" in capsys.readouterr().err
    missing = write("m.jsonl", b"".join(lines[:5] + lines[6:]))  # a record lost in the middle
    assert diff_main([str(a), missing]) == 2
    assert "expected op record 4" in capsys.readouterr().err
    assert diff_main([str(a), str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot open" in capsys.readouterr().err


def test_structural_divergence(tmp_path):
    def f(x):
        y = x.exp()
        return y.relu() if float(x.sum()) > 0 else y.tanh()

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    pos, neg = torch.ones(3), -torch.ones(3)
    with carbon.trace(a):
        f(pos)
    with carbon.trace(b):
        f(neg)
    r = diff_traces(a, b)
    # op 0 exp: inputs differ already; op 1 sum; op 2 .item(); op 3: relu vs tanh
    assert r.first.index == 0 and not r.first.inputs_identical and r.first_input is None
    s = r.structural
    assert (s.index, s.op_a, s.op_b) == (3, "aten::relu", "aten::tanh") and r.aligned == 3
    assert "Structural divergence at op 3" in r.report()


def test_html_report_is_self_contained(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    trace_step(a, *make(), save="hash")
    trace_step(b, *make(seed=1), save="hash")
    out = tmp_path / "report.html"
    assert diff_main([str(a), str(b), "--html", str(out)]) == 1
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert "http://" not in page and "https://" not in page and "<script src" not in page and "<link" not in page
    assert "First divergence" in page and "class='first'" in page and "c-first" in page


def test_compare_devices_cpu_cpu_identical(capsys):
    net, x = make()
    opt_lr = 0.1

    def step(model, inp):
        loss = torch.nn.functional.dropout(model(inp), 0.5).square().mean()  # randomness: same CPU draws
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= opt_lr * p.grad

    r = compare_devices(step, net, x, devices=("cpu", "cpu"))
    assert r.identical and r.first is None and r.aligned > 20
    assert "IDENTICAL" in capsys.readouterr().out
    # the caller's model was copied, not trained
    assert all(p.grad is None for p in net.parameters())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a CUDA device")
def test_compare_devices_without_cuda_says_so():
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        compare_devices(lambda x: x.exp(), torch.ones(2))
    with pytest.raises(ValueError, match="exactly two devices"):
        compare_devices(lambda x: x.exp(), torch.ones(2), devices=("cpu",))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compare_devices_cpu_cuda():
    net, x = make()

    def fwd(model, inp):
        model(inp).square().mean().backward()

    r = compare_devices(fwd, net, x, devices=("cpu", "cuda"), verbose=False)
    assert r.aligned > 0 and r.header_a["format"] == r.header_b["format"]
    assert r.footer_a["devices"] == ["cpu"] and r.footer_b["devices"] == ["cuda:0"]
    if r.first is not None:  # a divergence is a finding, not a failure; it must be located
        assert r.first.op.startswith("aten::")


def test_main_entry_point_lists_diff(capsys):
    from carbon.__main__ import main as carbon_main

    with pytest.raises(SystemExit) as e:
        carbon_main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "diff" in out and "demo" in out
