"""``python -m carbon demo``: train a small GPT with plain PyTorch and under
Carbon, and compare the weights bit for bit.

The model and the training loop (carbon/demo_gpt.py) are ordinary PyTorch:
nn.Embedding, nn.LayerNorm, nn.Linear, nn.GELU, F.scaled_dot_product_attention
(causal), F.cross_entropy, torch.optim.AdamW, torch.nn.utils.clip_grad_norm_,
weights initialized with nn.init.normal_. They are trained on the text that
ships with carbon (carbon/data/corpus.txt) in several configurations:

* on the CPU with 1 thread, with 2 threads, and with each batch split into 2
  micro-batches (gradient accumulation);
* each once with plain PyTorch and once inside ``carbon.enabled(seed=...)``,
  which runs the same torch calls on Carbon's correctly rounded kernels and
  draws torch's random numbers from a carbon.Generator;
* on CUDA too (plain and Carbon) when a GPU is present.

It prints one row per run — device, implementation, configuration, final
loss and the fingerprint of the model and optimizer state
(:func:`carbon.fingerprint`, first 16 hex digits) — and saves the loss
curves to a PNG. Plain PyTorch's fingerprints differ between thread counts
and devices; Carbon's are identical. The exit status is 1 if a Carbon
fingerprint that should match does not.

Micro-batches. Splitting a batch changes Carbon's bits too, and the table
says so instead of hiding it: every activation and per-token gradient is the
same, but each parameter gradient becomes a float32 sum of k separately
rounded partial sums (autograd accumulates them in p.grad) instead of one
rounding of the whole exact sum. The split runs are checked against each
other instead: the same split gives the same bits at 1 and 2 threads and on
every device (carbon/demo_gpt.py explains the loss formulation).

Golden value. ``tests/demo_golden.txt`` (in a source checkout) holds the
fingerprint of a short Carbon run (``carbon.demo_gpt.GOLDEN``) recorded once
on the CPU; the demo reruns it on every device and prints whether it matches.

The exact matmul reference used by the benchmarks lives in
:mod:`carbon.reference` (re-exported here for old imports).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

import torch

from carbon.reference import (  # noqa: F401  (re-exported: the benchmarks' exact reference)
    correctly_rounded_reference,
    count_correctly_rounded,
    round_double_to,
    sample_indices,
)

__all__ = [
    "correctly_rounded_reference", "count_correctly_rounded", "round_double_to", "sample_indices",
    "carbon_context", "golden_path", "read_golden", "run_demo", "main",
]

GOLDEN_FILE = "demo_golden.txt"


# --------------------------------------------------------------------------
# Running the same training code under Carbon


def carbon_context(seed: int) -> Callable[[], ContextManager]:
    """The context of a Carbon run: ``lambda: carbon.enabled(seed=seed)``
    (strict: an op Carbon does not cover would raise, not run inexactly).
    The model code runs unmodified inside it."""
    import carbon

    return lambda: carbon.enabled(seed=seed, strict=True)


# --------------------------------------------------------------------------
# Golden value


def golden_path() -> Path:
    """tests/demo_golden.txt next to the carbon package (a source checkout)."""
    return Path(__file__).resolve().parent.parent / "tests" / GOLDEN_FILE


def read_golden(path: Optional[Path] = None) -> Optional[str]:
    """The golden hexdigest (64 hex digits), or None if the file is absent
    or holds no digest. Lines starting with '#' are comments."""
    path = path or golden_path()
    if not path.is_file():
        return None
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            if len(line) != 64 or any(c not in "0123456789abcdef" for c in line):
                raise ValueError(f"{path}: expected a 64-digit lowercase hex SHA-256, got {line!r}")
            return line
    return None


def golden_run(device: str = "cpu", threads: Optional[int] = None):
    """Train carbon.demo_gpt.GOLDEN under Carbon on ``device``; returns the
    fingerprint of the model and optimizer."""
    import carbon
    from carbon.demo_gpt import GOLDEN, train

    result = train(replace(GOLDEN, device=device, threads=threads), context=carbon_context(GOLDEN.seed))
    return carbon.fingerprint(result.model, result.optimizer)


# --------------------------------------------------------------------------
# The demo


@dataclass
class _Run:
    device: str
    carbon: bool
    threads: Optional[int]
    micro_batches: int
    losses: List[float]
    fingerprint: object
    seconds: float

    @property
    def impl(self) -> str:
        return "carbon" if self.carbon else "torch"

    @property
    def label(self) -> str:
        t = "" if self.threads is None else f"{self.threads} thread{'s' if self.threads > 1 else ''}, "
        b = "full batch" if self.micro_batches == 1 else f"{self.micro_batches} micro-batches"
        return f"{t}{b}"


def _format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])


def _plot(runs: List[_Run], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    # each run against the first run of its implementation (cpu, 1 thread, full batch)
    refs = {}
    for r in runs:
        refs.setdefault(r.carbon, r)
    for r in runs:
        ref = refs[r.carbon]
        style = dict(linestyle="--" if r.carbon else "-", linewidth=1.2, alpha=0.85)
        name = f"{r.device} {r.impl}, {r.label}"
        ax1.plot(range(1, len(r.losses) + 1), r.losses, label=name, **style)
        diff, worst = [], 0.0
        for a, b in zip(r.losses, ref.losses):  # running maximum of |loss - reference loss|
            worst = max(worst, abs(a - b))
            diff.append(worst)
        ax2.plot(range(1, len(diff) + 1), diff, label=name, **style)
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss (cross-entropy, nats/char)")
    ax1.set_title("loss curves")
    ax1.legend(fontsize=7)
    ax2.set_yscale("symlog", linthresh=1e-7)
    ax2.set_xlabel("step")
    ax2.set_ylabel("running max of |loss - reference loss|")
    ax2.set_title("each run vs. its implementation's cpu 1-thread full-batch run\n(0: the same loss at every step)",
                  fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_demo(steps: int = 250, device: str = "all", seed: int = 0, batch_size: int = 16, threads: int = 2,
             plot: Optional[str] = "carbon_demo_loss.png", progress: bool = True, golden: bool = True,
             model: Optional[dict] = None) -> int:
    """Run the demo (see the module docstring); returns the exit status.
    ``model`` overrides the model size (carbon.demo_gpt.TrainConfig.model)."""
    import carbon
    from carbon.demo_gpt import CharData, GOLDEN, TrainConfig, load_corpus, train

    if steps < 1:
        raise ValueError(f"carbon demo: --steps must be >= 1, got {steps}")
    if batch_size < 2 or batch_size % 2:
        raise ValueError(f"carbon demo: --batch-size must be even and >= 2 (it is split in 2), got {batch_size}")
    if threads < 2:
        raise ValueError(f"carbon demo: --threads must be >= 2 (compared with 1 thread), got {threads}")
    if plot and importlib.util.find_spec("matplotlib") is None:
        # say so now, not after minutes of training
        print("carbon demo: matplotlib is not installed (pip install matplotlib, or carbon[demo]): no loss-curve PNG")
        plot = None
    devices = ["cpu"]
    if device in ("cuda", "all") and torch.cuda.is_available():
        devices.append("cuda")
    elif device == "cuda":
        print("carbon demo: CUDA is not available on this machine")
        return 1

    data = CharData(load_corpus())
    base = TrainConfig(steps=steps, batch_size=batch_size, seed=seed)
    if model is not None:
        base = replace(base, model={**base.model, **model})
    m = base.model
    context = carbon_context(seed)
    n_params = sum(p.numel() for p in _count_model(data, base).parameters())
    tokens = batch_size * int(m["block_size"])
    title = (f"GPT {m['n_layer']} layers, d={m['n_embd']}, {m['n_head']} heads ({n_params / 1e3:.0f}k parameters), "
             f"{steps} steps of AdamW, batch {batch_size} x {m['block_size']} chars, seed {seed}")
    print(f"carbon demo: {title}")
    print(f"corpus: carbon/data/corpus.txt, {len(data.tokens)} characters, {data.vocab_size} symbols; "
          f"loss = sum of per-token cross-entropies / {tokens} per micro-batch")
    print(f"torch {torch.__version__}, carbon {carbon.__version__}; carbon runs: the same code inside "
          f"carbon.enabled(seed={seed})")
    if "cuda" in devices:
        print(f"GPU: {torch.cuda.get_device_name()} (TF32 for float32 matmul: "
              f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'})")
    print()

    plan: List[Tuple[str, bool, Optional[int], int]] = []
    for use_carbon in (False, True):
        plan += [("cpu", use_carbon, 1, 1), ("cpu", use_carbon, threads, 1), ("cpu", use_carbon, 1, 2)]
        if use_carbon:
            plan.append(("cpu", True, threads, 2))
    if "cuda" in devices:
        plan += [("cuda", False, None, 1), ("cuda", True, None, 1), ("cuda", True, None, 2)]

    runs: List[_Run] = []
    for dev, use_carbon, n_threads, micro in plan:
        cfg = replace(base, device=dev, threads=n_threads, micro_batches=micro)
        desc = f"{dev} {'carbon' if use_carbon else 'torch'} {_Run(dev, use_carbon, n_threads, micro, [], None, 0).label}"
        bar = _progress_bar(steps, desc, enabled=progress)

        def tick(step: int, loss: float) -> None:
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            bar.update(1)

        try:
            result = train(cfg, data, context=context if use_carbon else None, progress=tick)
        finally:
            bar.close()
        fp = carbon.fingerprint(result.model, result.optimizer)
        runs.append(_Run(dev, use_carbon, n_threads, micro, result.losses, fp, result.seconds))

    # Which Carbon fingerprints must agree: all full-batch runs, and all runs with the same split.
    groups: Dict[int, List[_Run]] = {}
    for r in runs:
        if r.carbon:
            groups.setdefault(r.micro_batches, []).append(r)
    failures = [f"carbon, {k} micro-batch(es): {len({str(r.fingerprint) for r in g})} different fingerprints"
                for k, g in groups.items() if len({r.fingerprint for r in g}) > 1]

    header = ["device", "implementation", "configuration", "final loss", "fingerprint (weights + AdamW)", "s/run"]
    rows = [[r.device, r.impl, r.label, f"{r.losses[-1]:.7f}", str(r.fingerprint), f"{r.seconds:.1f}"] for r in runs]
    print(_format_table(header, rows))
    print()
    plain = [r for r in runs if not r.carbon]
    print(f"torch:  {len(plain)} runs, {len({r.fingerprint for r in plain})} different fingerprints.")
    for k, g in sorted(groups.items()):
        where = "; ".join(f"{r.device} {r.label}" for r in g)
        distinct = len({r.fingerprint for r in g})
        verdict = "one fingerprint (the same bits)" if distinct == 1 else f"{distinct} DIFFERENT fingerprints"
        print(f"carbon: {'full batch' if k == 1 else f'{k} micro-batches'} — {len(g)} runs ({where}): {verdict}.")
    if len(groups) > 1:
        print("        Splitting the batch changes Carbon's bits: each parameter gradient is then the float32 sum\n"
              "        of separately rounded micro-batch sums (autograd accumulates them in p.grad) instead of one\n"
              "        rounding of the exact sum over the whole batch. Every activation and per-token gradient is\n"
              "        unchanged; a given split is reproducible on any thread count and device.")

    if golden:
        expected = read_golden()
        if expected is None:
            print(f"\ngolden: no golden fingerprint found ({golden_path()}); not checked")
        else:
            print(f"\ngolden run (carbon.demo_gpt.GOLDEN: {GOLDEN.steps} steps, tiny model) vs tests/{GOLDEN_FILE} "
                  f"{expected[:16]}:")
            for dev in devices:
                got = golden_run(dev)
                ok = got.hexdigest == expected
                print(f"golden check {dev}: {got.short} {'== golden: OK' if ok else '!= golden: FAIL'}")
                if not ok:
                    failures.append(f"golden check on {dev}")

    if plot:
        _plot(runs, plot, title)
        print(f"\nloss curves: {plot}")
    if failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    return 0


def _count_model(data, cfg):
    from carbon.demo_gpt import GPT, GPTConfig

    with torch.device("meta"):
        return GPT(GPTConfig(vocab_size=data.vocab_size, **cfg.model))


class _NoBar:
    def update(self, n=1):
        return None

    def set_postfix(self, **kw):
        return None

    def close(self):
        return None


def _progress_bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is in requirements.txt; run without a bar if it is missing
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="step", leave=True, dynamic_ncols=True, file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m carbon`` (see carbon/__main__.py)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m carbon",
        description="Carbon: bit-exact deep learning for PyTorch (correctly rounded kernels).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="train a small GPT with plain PyTorch and under Carbon; compare the fingerprints",
        description="Train a small character-level GPT (plain torch.nn code) with plain PyTorch and under "
                    "carbon.enabled, at 1 and several CPU threads, with and without micro-batches, and on CUDA "
                    "when present; print final losses and weight fingerprints, save the loss curves.",
    )
    demo.add_argument("--steps", type=int, default=250, help="training steps per run (default: 250)")
    demo.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                      help="cpu, or cpu and cuda (all: cuda when available; default: all)")
    demo.add_argument("--seed", type=int, default=0, help="seed of initialization, dropout and data (default: 0)")
    demo.add_argument("--batch-size", type=int, default=16, help="sequences per step, even (default: 16)")
    demo.add_argument("--threads", type=int, default=2, help="the CPU thread count compared with 1 (default: 2)")
    demo.add_argument("--plot", default="carbon_demo_loss.png",
                      help="where to save the loss-curve PNG (default: carbon_demo_loss.png)")
    demo.add_argument("--no-plot", action="store_true", help="do not save a PNG")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.add_argument("--no-golden", action="store_true", help="skip the golden-fingerprint check")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "demo":
        try:
            return run_demo(steps=args.steps, device=args.device, seed=args.seed, batch_size=args.batch_size,
                            threads=args.threads, plot=None if args.no_plot else args.plot,
                            progress=not args.no_progress, golden=not args.no_golden)
        except ValueError as e:
            parser.error(str(e))
    parser.error(f"unknown command {args.command!r}")
    return 2
