"""``python -m carbon demo``: what "correctly rounded" buys, measured.

Multiplies two random float32 matrices with a wide dynamic range (fixed seed)
with ``torch.matmul`` and with ``carbon.mm`` on the CPU (and on CUDA when a GPU
is present) and prints, per device and implementation:

* the share of sampled outputs equal to the correctly rounded exact result,
  checked independently of Carbon's kernels (``math.fsum``, see below);
* whether row 0 has the same bits when computed alone (M = 1) as inside the
  full product (M = 256), i.e. whether results depend on the batch size;
* whether the CPU result has the same bits at 1 thread and at several;
* whether the GPU result has the same bits as the CPU result;
* the time of one product.

This module is also the one home of the reference check that the benchmarks
(benchmarks/bench_mm.py) import: :func:`correctly_rounded_reference` and
:func:`count_correctly_rounded`.

The reference. Every product of two float32 / bfloat16 / float16 values is
exact in double, and ``math.fsum`` returns the exact sum of doubles rounded
once to double (d = RN64(c)). Rounding d again to float32 can be wrong only
when d lies exactly on a float32 midpoint (every float32 midpoint is a double,
so otherwise c and d are on the same side of every midpoint); in that case the
sign of ``fsum(terms + [-d])`` (exact, since fsum is correctly rounded) says
which way c lies. The same holds for bfloat16 and float16. The final rounding
is done with exact integer arithmetic here, not with a hardware conversion.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, List, Optional, Sequence, Tuple

import torch

__all__ = [
    "correctly_rounded_reference",
    "count_correctly_rounded",
    "round_double_to",
    "sample_indices",
    "main",
]

# (precision incl. hidden bit, exponent of the smallest normal, largest exponent)
_FORMATS = {
    torch.float32: (24, -126, 127),
    torch.bfloat16: (8, -126, 127),
    torch.float16: (11, -14, 15),
}


def round_double_to(d: float, dtype: torch.dtype, midpoint_sign: Optional[Callable[[], int]] = None) -> float:
    """RN (ties to even) of the double ``d`` into ``dtype``, returned as a Python float.

    ``d`` stands for an exact value ``c`` with ``d == RN64(c)``. If ``d`` is
    exactly a midpoint of ``dtype``, ``midpoint_sign()`` must return the sign of
    ``c - d`` (-1, 0, +1) and decides the direction; without it ``c == d`` is
    assumed. Overflow gives +-inf, underflow keeps subnormals and the sign.
    """
    precision, min_normal_exp, max_exp = _FORMATS[dtype]
    if d == 0.0 or math.isnan(d) or math.isinf(d):
        return d
    negative = d < 0.0
    x = -d if negative else d
    _, e = math.frexp(x)  # x = m * 2**e, 0.5 <= m < 1: the leading bit has weight 2**(e-1)
    q = max(e - precision, min_normal_exp - precision + 1)  # weight of the result's last bit
    scaled = math.ldexp(x, -q)  # exact: a power-of-two scaling that stays normal
    kept = math.floor(scaled)
    rest = scaled - kept  # exact: scaled < 2**(precision+1) has no bits below 2**-53 * scaled
    if rest > 0.5:
        kept += 1
    elif rest == 0.5:
        s = midpoint_sign() if midpoint_sign is not None else 0
        if negative:
            s = -s  # c - d > 0 moves the magnitude down for a negative d
        if s > 0 or (s == 0 and kept % 2 == 1):
            kept += 1
    if q > max_exp + 1 or kept >= 2 ** (max_exp + 1 - q):  # kept * 2**q >= 2**(max_exp+1)
        return -math.inf if negative else math.inf
    r = math.ldexp(kept, q)
    return -r if negative else r


def _reference_from_terms(terms: List[float], dtype: torch.dtype) -> float:
    """Correctly rounded ``sum(terms)`` in ``dtype`` (terms are exact doubles)."""
    if not all(math.isfinite(t) for t in terms):
        if any(math.isnan(t) for t in terms):
            return math.nan
        pos = any(t == math.inf for t in terms)
        neg = any(t == -math.inf for t in terms)
        return math.nan if (pos and neg) else (math.inf if pos else -math.inf)
    d = math.fsum(terms)
    if d == 0.0:
        # An exact zero: -0 iff there is a term and every term is -0 (IEEE's
        # rule for x + y applied to the whole sum; docs/contract.md).
        all_neg_zero = bool(terms) and all(t == 0.0 and math.copysign(1.0, t) < 0 for t in terms)
        return -0.0 if all_neg_zero else 0.0

    def midpoint_sign() -> int:
        r = math.fsum(terms + [-d])
        return (r > 0) - (r < 0)

    return round_double_to(d, dtype, midpoint_sign)


def sample_indices(m: int, n: int, count: int, seed: int = 0) -> List[Tuple[int, int]]:
    """``count`` distinct (row, column) positions of an m x n output (all of them if fewer)."""
    total = m * n
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(total, generator=g)[: min(count, total)].tolist()
    return [(f // n, f % n) for f in flat]


def correctly_rounded_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    indices: Sequence[Tuple[int, int]],
    *,
    bias: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> List[float]:
    """RN_out(bias[i, j] + sum_k a[i, k] * b[k, j]) for each (i, j) in ``indices``.

    ``a`` (M, K) and ``b`` (K, N) may be on any device; only the sampled rows
    and columns are copied to the CPU. ``bias`` broadcasts to (M, N). The
    output dtype defaults to the promoted input dtype, as in carbon.mm.
    """
    out_dtype = out_dtype or torch.promote_types(a.dtype, b.dtype)
    if not indices:
        return []
    rows = torch.tensor([i for i, _ in indices], device=a.device)
    cols = torch.tensor([j for _, j in indices], device=b.device)
    a_rows = a.index_select(0, rows).cpu().double()          # (S, K)
    b_cols = b.index_select(1, cols).t().cpu().double()      # (S, K)
    products = (a_rows * b_cols).tolist()  # exact: at most 2 x 24 significant bits, no underflow
    if bias is not None:
        full = bias.expand(a.shape[0], b.shape[1])
        extra = full[rows.to(full.device), cols.to(full.device)].cpu().double().tolist()
        for p, x in zip(products, extra):
            p.append(x)
    return [_reference_from_terms(p, out_dtype) for p in products]


def _same_value(x: float, y: float) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)


def count_correctly_rounded(
    out: torch.Tensor, indices: Sequence[Tuple[int, int]], reference: Sequence[float]
) -> int:
    """How many of the sampled entries of the 2-D ``out`` equal ``reference`` (sign of zero included)."""
    if not indices:
        return 0
    rows = torch.tensor([i for i, _ in indices], device=out.device)
    cols = torch.tensor([j for _, j in indices], device=out.device)
    got = out[rows, cols].cpu().double().tolist()  # exact for every supported dtype
    return sum(_same_value(g, r) for g, r in zip(got, reference))


# --------------------------------------------------------------------------
# The demo


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    view = {4: torch.int32, 2: torch.int16, 8: torch.int64}[t.element_size()]
    return t.view(view).cpu()


def _same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(_bits(x), _bits(y))


def _median_ms(fn: Callable[[], torch.Tensor], device: torch.device, reps: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _demo_inputs(m: int, k: int, n: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """float32 matrices with a wide dynamic range: normal * 2**uniform(-8, 8)."""
    g = torch.Generator().manual_seed(seed)

    def make(rows: int, cols: int) -> torch.Tensor:
        x = torch.randn(rows, cols, generator=g, dtype=torch.float64)
        scale = torch.exp2(torch.empty(rows, cols, dtype=torch.float64).uniform_(-8.0, 8.0, generator=g))
        return (x * scale).float()

    return make(m, k), make(k, n)


def _yes_no(flag: Optional[bool]) -> str:
    return "n/a" if flag is None else ("yes" if flag else "NO")


def _format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])


def run_demo(device: str = "all", seed: int = 0, m: int = 256, k: int = 4096, n: int = 256, samples: int = 256) -> int:
    import carbon

    devices = [torch.device("cpu")]  # with --device cuda the CPU still runs: it is the reference for CPU == GPU
    if device in ("cuda", "all") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    elif device == "cuda":
        print("carbon demo: CUDA is not available on this machine")
        return 1

    a, b = _demo_inputs(m, k, n, seed)
    idx = sample_indices(m, n, samples, seed)
    t0 = time.perf_counter()
    ref = correctly_rounded_reference(a, b, idx)
    ref_s = time.perf_counter() - t0

    tf32 = torch.backends.cuda.matmul.allow_tf32
    impls = [
        ("torch.matmul", torch.matmul),
        ("carbon.mm", carbon.mm),
    ]
    threads = torch.get_num_threads()
    many = max(2, threads)
    print(f"carbon demo: A {m}x{k} @ B {k}x{n}, float32, entries normal * 2**uniform(-8, 8), seed {seed}")
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {threads} CPU threads"
          + (f", GPU: {torch.cuda.get_device_name()} (TF32 for fp32 matmul: {'on' if tf32 else 'off'})"
             if len(devices) > 1 else (", GPU not used (--device cpu)" if torch.cuda.is_available() else ", no GPU")))
    print(f"reference: {len(idx)} sampled outputs, exact sum via math.fsum + midpoint-safe rounding ({ref_s:.2f} s)")
    print()

    cpu_results = {}
    rows = []
    carbon_failures = []
    for dev in devices:
        ad, bd = a.to(dev), b.to(dev)
        for name, fn in impls:
            full = fn(ad, bd)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            ok = count_correctly_rounded(full, idx, ref)
            row0_alone = _same_bits(fn(ad[:1], bd)[0], full[0])
            threads_same = None
            cpu_gpu = None
            if dev.type == "cpu":
                cpu_results[name] = full
                try:
                    torch.set_num_threads(1)
                    one = fn(ad, bd)
                    torch.set_num_threads(many)
                    several = fn(ad, bd)
                finally:
                    torch.set_num_threads(threads)
                threads_same = _same_bits(one, several) and _same_bits(one, full)
            else:
                cpu_gpu = _same_bits(full, cpu_results[name])
            if name.startswith("carbon"):
                checks = {"correctly rounded": ok == len(idx), "row 0 alone": row0_alone,
                          "thread count": threads_same, "CPU == GPU": cpu_gpu}
                carbon_failures += [f"{dev.type} {name}: {c}" for c, passed in checks.items() if passed is False]
            ms = _median_ms(lambda: fn(ad, bd), dev)
            rows.append([
                dev.type,
                name,
                f"{ok}/{len(idx)} ({100.0 * ok / len(idx):.1f}%)",
                _yes_no(row0_alone),
                _yes_no(threads_same),
                _yes_no(cpu_gpu),
                f"{ms:.2f}",
            ])
    header = [
        "device",
        "implementation",
        "correctly rounded (sample)",
        "row 0 alone == in batch (M=1 vs M=%d)" % m,
        f"same bits at 1 vs {many} threads",
        "CPU == GPU",
        "time ms",
    ]
    print(_format_table(header, rows))
    print()
    print("carbon.mm returns RN(exact sum) for every output, so all its columns should read 100% / yes.")
    if carbon_failures:
        print("FAIL: carbon broke its contract here: " + "; ".join(carbon_failures))
        return 1
    return 0


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
        help="compare torch.matmul and carbon.mm: exactness, batch/thread/device invariance, time",
        description="Compare torch.matmul and carbon.mm on random float32 matrices with a wide dynamic range.",
    )
    demo.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                      help="devices to run on (default: all available)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    demo.add_argument("--samples", type=int, default=256, help="outputs checked against the exact result (default: 256)")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "demo":
        return run_demo(device=args.device, seed=args.seed, samples=args.samples)
    parser.error(f"unknown command {args.command!r}")
    return 2
