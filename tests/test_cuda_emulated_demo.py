"""The demo's golden run (carbon.demo_gpt.GOLDEN: 4 steps of a 1-layer GPT under carbon.enabled) with every carbon
op running carbon's CUDA kernels on the CPU emulator (tests/cuda_emulator/swap_in.py) reproduces the golden
fingerprint recorded on the CPU (tests/demo_golden.txt) -- what scripts/device_check.sh asks of a GPU: forward,
backward, dropout, clip_grad_norm_ and AdamW, end to end. In a process of its own: the swap cannot be undone."""

import os
import subprocess
import sys

from carbon.demo import read_golden
from emulated import emulated_ops

TESTS = os.path.dirname(os.path.abspath(__file__))

SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from cuda_emulator.swap_in import use_emulated_kernels
import torch, carbon
from carbon.demo import carbon_context
from carbon.demo_gpt import GOLDEN, train
lib = use_emulated_kernels()
before = int(torch.ops.carbon_emu._emu_launches())
result = train(GOLDEN, context=carbon_context(GOLDEN.seed))
print("launches", int(torch.ops.carbon_emu._emu_launches()) - before)
print("fingerprint", carbon.fingerprint(result.model, result.optimizer).hexdigest)
"""


def test_golden_run_on_emulated_cuda_kernels():
    emulated_ops()  # builds the library here (or skips), not inside the child's time
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=TESTS)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("launches", "fingerprint")))
    assert int(lines["launches"]) > 100, f"the run launched {lines['launches']} emulated kernels"
    assert lines["fingerprint"] == read_golden(), (
        f"emulated CUDA kernels: {lines['fingerprint']}, golden (CPU): {read_golden()}")
