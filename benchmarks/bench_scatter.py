"""carbon's exact indexed accumulations against torch's, side by side.

    python benchmarks/bench_scatter.py [--device cpu|cuda|all] [--budget S]

Cases: the embedding backward of GPT-2 (vocab 50257, dim 768, 4096 tokens
with Zipf-like repeats) -- torch: F.embedding_dense_backward, carbon:
torch.ops.carbon.embedding_backward --, the same for a character-level model
(65 symbols, dim 384, 16384 tokens: ~250 repeats of every row, the demo's
case), and an index_add of 4096 rows of 768
into 1024 rows (out of place: torch.index_add vs carbon.index_add). Times are
medians of interleaved rounds (benchmarks/_timing.py). Target (issue 4):
carbon <= 1.5x torch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import List, Optional

import torch

try:
    import carbon
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import carbon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_load, print_report, time_interleaved  # noqa: E402


def zipf_tokens(n: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """Token ids whose frequencies fall off like 1/rank (many repeats)."""
    weights = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    return torch.multinomial(weights, n, replacement=True, generator=g)


def bench(device: str, budget_s: float, dtype: torch.dtype) -> List[dict]:
    g = torch.Generator().manual_seed(0)
    vocab, dim, n = 50257, 768, 4096
    tok = zipf_tokens(n, vocab, g).to(device)
    grad = torch.randn((n, dim), generator=g).to(dtype).to(device)
    rows = []

    emb = [lambda: torch.ops.aten.embedding_dense_backward(grad, tok, vocab, -1, False),
           lambda: torch.ops.carbon.embedding_backward(grad, tok, vocab, -1)]
    chars, char_dim, char_n = 65, 384, 16384
    char_tok = torch.randint(0, chars, (char_n,), generator=g).to(device)
    char_grad = torch.randn((char_n, char_dim), generator=g).to(dtype).to(device)
    char_emb = [lambda: torch.ops.aten.embedding_dense_backward(char_grad, char_tok, chars, -1, False),
                lambda: torch.ops.carbon.embedding_backward(char_grad, char_tok, chars, -1)]
    self_ = torch.randn((1024, dim), generator=g).to(dtype).to(device)
    idx = torch.randint(0, 1024, (n,), generator=g).to(device)
    add = [lambda: torch.index_add(self_, 0, idx, grad), lambda: carbon.index_add(self_, 0, idx, grad)]
    for name, case, fns in (("embedding backward", f"{vocab}x{dim}, {n} tokens", emb),
                            ("embedding backward", f"{chars}x{char_dim}, {char_n} tokens", char_emb),
                            ("index_add", f"1024x{dim} += {n} rows", add)):
        times = time_interleaved(fns, device, budget_s, 20)
        ms = [statistics.median(t) for t in times]
        rows.append({"op": name, "case": f"{case} {str(dtype).replace('torch.', '')}", "torch": ms[0], "carbon": ms[1]})
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--budget", type=float, default=1.5, help="seconds of timing per case")
    args = parser.parse_args(argv)
    devices = ["cpu"] if args.device == "cpu" else (["cuda"] if args.device == "cuda" else ["cpu", "cuda"])
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    print(f"torch {torch.__version__}, carbon {carbon.__version__}, {torch.get_num_threads()} CPU threads, load {machine_load()}")
    lines = ["| device | op | case | torch ms | carbon ms | carbon/torch |", "|---|---|---|---|---|---|"]
    ratios = []
    for device in devices:
        for dtype in (torch.float32, torch.bfloat16):
            for r in bench(device, args.budget, dtype):
                ratio = r["carbon"] / r["torch"]
                lines.append(f"| {device} | {r['op']} | {r['case']} | {r['torch']:.3f} | {r['carbon']:.3f} | {ratio:.2f}x |")
                ratios.append(f"RATIO {device} {r['op']} {r['case']} carbon/torch = {ratio:.2f} (target <= 1.5)")
    return print_report(lines, ratios)


if __name__ == "__main__":
    sys.exit(main())
