"""The training demo (python -m carbon demo, carbon/demo_gpt.py).

References: the same Carbon run at another thread count, and the golden
fingerprint in tests/demo_golden.txt (recorded once, on the CPU, from
carbon.enabled; see that file)."""

from dataclasses import replace

import pytest
import torch

import carbon
from carbon.demo import carbon_context, golden_path, golden_run, read_golden, run_demo
from carbon.demo_gpt import GOLDEN, GPT, CharData, GPTConfig, load_corpus, train

TINY = dict(block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.1)


def _carbon_fingerprint(cfg):
    result = train(cfg, context=carbon_context(cfg.seed))
    return carbon.fingerprint(result.model, result.optimizer), result


def test_carbon_same_bits_at_1_and_2_threads(restore_num_threads):
    one, r1 = _carbon_fingerprint(replace(GOLDEN, threads=1))
    two, r2 = _carbon_fingerprint(replace(GOLDEN, threads=2))
    assert one == two, one.diff(two)
    assert r1.losses == r2.losses
    assert torch.get_num_threads() == restore_num_threads  # train() puts the thread count back


def test_carbon_micro_batches_same_bits_at_1_and_2_threads(restore_num_threads):
    cfg = replace(GOLDEN, micro_batches=2, steps=3)
    one, _ = _carbon_fingerprint(replace(cfg, threads=1))
    two, _ = _carbon_fingerprint(replace(cfg, threads=2))
    assert one == two, one.diff(two)


def test_golden_fingerprint():
    """The committed golden value (tests/demo_golden.txt, recorded once with carbon.enabled)."""
    expected = read_golden()
    assert expected is not None, f"{golden_path()} holds no digest"
    got, _ = _carbon_fingerprint(GOLDEN)
    assert got.hexdigest == expected
    assert golden_run("cpu") == got  # the demo's own golden check computes the same


def test_plain_and_carbon_runs_see_the_same_data():
    data = CharData(load_corpus())
    a = data.batches(4, 16, seed=7)
    b = data.batches(4, 16, seed=7)
    for _ in range(3):
        (xa, ya), (xb, yb) = next(a), next(b)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert torch.equal(xa[:, 1:], ya[:, :-1])
    text = "the keeper counts"
    assert data.decode(data.encode(text)) == text


def test_model_is_plain_torch():
    """The demo's model is built from torch.nn modules only (carbon runs it through carbon.enabled)."""
    model = GPT(GPTConfig(vocab_size=10, **TINY))
    for m in model.modules():
        if type(m).__module__.startswith("torch"):
            continue
        assert type(m).__module__ == "carbon.demo_gpt", type(m)


def test_run_demo_tiny(tmp_path, capsys, restore_num_threads):
    png = tmp_path / "loss.png"
    status = run_demo(steps=2, device="cpu", batch_size=4, plot=str(png), progress=False, golden=False, model=TINY)
    out = capsys.readouterr().out
    assert status == 0, out
    assert png.is_file() and png.stat().st_size > 0
    rows = [line for line in out.splitlines() if line.startswith("| cpu")]
    assert len(rows) == 7
    carbon_full = {line.split("|")[5].strip() for line in rows if "carbon" in line and "full batch" in line}
    assert len(carbon_full) == 1


def test_run_demo_without_matplotlib_says_so_first(tmp_path, capsys, monkeypatch, restore_num_threads):
    """Without matplotlib the demo says at the start that it saves no PNG and
    still trains and prints its table (it used to fail after training)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    png = tmp_path / "loss.png"
    status = run_demo(steps=1, device="cpu", batch_size=4, plot=str(png), progress=False, golden=False, model=TINY)
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.splitlines()[0].startswith("carbon demo: matplotlib is not installed")
    assert not png.exists() and any(line.startswith("| cpu") for line in out.splitlines())


def test_errors():
    with pytest.raises(ValueError, match="micro_batches"):
        train(replace(GOLDEN, micro_batches=3))
    with pytest.raises(ValueError, match="steps"):
        train(replace(GOLDEN, steps=0))
    with pytest.raises(ValueError, match="batch-size"):
        run_demo(steps=1, batch_size=3)


def test_reference_helpers_still_importable():
    from carbon.demo import correctly_rounded_reference, count_correctly_rounded, round_double_to, sample_indices
    from carbon import reference

    assert correctly_rounded_reference is reference.correctly_rounded_reference
    assert callable(count_correctly_rounded) and callable(round_double_to) and callable(sample_indices)


def test_micro_batch_split_changes_only_the_parameter_gradient_sums():
    """What the demo states about micro-batches, checked on one step under
    carbon.enabled (dropout 0): the logits and their per-token gradients have
    the same bits split or not; only the parameter gradients (sums over
    tokens, rounded once per backward) may differ, and by little."""
    data = CharData(load_corpus())
    x, y = next(data.batches(4, 16, seed=3))
    cfg = GPTConfig(vocab_size=data.vocab_size, **{**TINY, "dropout": 0.0})

    def step(chunks):
        with carbon.enabled(seed=5):
            model = GPT(cfg)
            outs, grads = [], []
            for xm, ym in zip(x.chunk(chunks), y.chunk(chunks)):
                logits = model(xm)
                logits.retain_grad()
                loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), ym.view(-1),
                                                         reduction="sum") / x.numel()
                loss.backward()
                outs.append(logits.detach())
                grads.append(logits.grad)
        return torch.cat(outs), torch.cat(grads), {n: p.grad for n, p in model.named_parameters()}

    logits1, dlogits1, g1 = step(1)
    logits2, dlogits2, g2 = step(2)
    assert torch.equal(logits1.view(torch.int32), logits2.view(torch.int32))
    assert torch.equal(dlogits1.view(torch.int32), dlogits2.view(torch.int32))
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-5, atol=1e-9, msg=name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_golden_fingerprint_cuda():
    """The GPU reproduces the golden value recorded on the CPU."""
    assert golden_run("cuda").hexdigest == read_golden()
