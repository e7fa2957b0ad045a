"""The CPU test suites of the reductions, normalizations and optimizers, rerun on carbon's CUDA kernels: a
pytest in a subprocess with CARBON_TEST_EMULATED_KERNELS=1 (conftest.py), which swaps every carbon op's CPU
kernel for its emulated CUDA twin (tests/cuda_emulator/swap_in.py) beneath carbon's Python layer and autograd.
So the CUDA paths that only those suites reach through the public API -- sums over leading dimensions (the
column kernels), the layer_norm / rms_norm parameter gradients, the optimizers' tensor-list launches,
clip_grad_norm_, nn.Linear's bias gradient, the scatter kernels' chunk sums, cumsum's chunked rows, the square
root -- are checked against the suites' own oracles (exact fractions, Python references), not only against the
CPU kernels' bits. Tests marked cpu_kernels (host-side index checks, CPU kernel variants) are skipped there."""

import os
import subprocess
import sys

from emulated import emulated_ops

TESTS = os.path.dirname(os.path.abspath(__file__))
SUITES = ["test_sum_exact.py", "test_mean_exact.py", "test_var.py", "test_layer_norm.py", "test_rms_norm.py",
          "test_nn_linear.py", "test_optim.py", "test_optim_capturable.py", "test_clip_grad.py", "test_scatter.py",
          "test_embedding.py", "test_cumsum.py", "test_sqrt.py"]


def test_cpu_suites_pass_on_the_emulated_cuda_kernels():
    emulated_ops()  # built here once (or skipped when CARBON_CUDA_EMULATOR=0)
    env = dict(os.environ, CARBON_TEST_EMULATED_KERNELS="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           *[os.path.join(TESTS, s) for s in SUITES]],
                          cwd=os.path.dirname(TESTS), env=env, capture_output=True, text=True, timeout=1800)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, f"the CPU suites failed on the emulated CUDA kernels:\n{tail}"
    # ~14 000 launches at the time of writing; far fewer means the kernels were not swapped in.
    launched = [int(line.rsplit(":", 1)[1]) for line in tail.splitlines() if line.startswith("emulated CUDA launches:")]
    assert launched and launched[0] > 5_000, f"the suites did not run on the emulated kernels:\n{tail}"
