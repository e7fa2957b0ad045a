"""Command line: ``python -m carbon COMMAND``.

* ``demo`` — train a small GPT with plain PyTorch and under carbon.enabled, compare fingerprints (carbon/demo.py); ``carbon.demo.main`` receives the
  whole argument list, ``demo`` included, as it always has.
* ``diff A B [--html report.html] [--allow-truncated]`` — compare two traces written by
  ``carbon.trace`` (carbon/diff.py). Exit code 0 identical, 1 different, 2 error.

Run ``python -m carbon --help`` for the list.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Dispatch to the subcommand; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "diff":
        from carbon.diff import main as diff_main

        return diff_main(args[1:])
    if args and args[0] == "demo":
        from carbon.demo import main as demo_main

        return demo_main(args)
    parser = argparse.ArgumentParser(
        prog="python -m carbon",
        description="Carbon: bit-exact deep learning for PyTorch (correctly rounded kernels).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("demo", help="train a small GPT with plain PyTorch and under carbon.enabled at 1/2 threads, "
                                "micro-batches and on CUDA; compare fingerprints (python -m carbon demo --help)")
    sub.add_parser("diff", help="compare two traces written by carbon.trace and report the first op whose "
                                "outputs differ (python -m carbon diff --help)")
    ns = parser.parse_args(args)  # only --help or an unknown command get here
    if ns.command is None:
        parser.print_help()
        return 0
    parser.error(f"unknown command {ns.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
