"""Bit-exact resume (contract §12): N training steps in one go equal k steps,
carbon.save, carbon.load in a fresh Python process, and N - k more steps:
the SHA-256 of every parameter and optimizer state agrees."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

import carbon
import resume_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, K = 6, 3


def test_resume_in_a_fresh_process(tmp_path):
    model, opt = resume_helper.make()
    resume_helper.train(model, opt, 0, N)
    straight = resume_helper.digest(model, opt)

    model, opt = resume_helper.make()
    resume_helper.train(model, opt, 0, K)
    path = str(tmp_path / "ckpt.pt")
    carbon.save(path, model=model, optimizer=opt, step=K)
    assert resume_helper.digest(model, opt) != straight  # the remaining steps do change the bits
    code = (f"import sys; sys.path.insert(0, 'tests'); import resume_helper; "
            f"resume_helper.resume({path!r}, {K}, {N})")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == straight

    # in-process continuation too (sanity), and the checkpoint's contents
    resume_helper.train(model, opt, K, N)
    assert resume_helper.digest(model, opt) == straight


def test_save_load_generators(tmp_path):
    path = str(tmp_path / "g.pt")
    g = torch.Generator().manual_seed(3)
    torch.randn(5, generator=g)
    carbon.save(path, generator=g, note="x")
    expected = torch.randn(4, generator=g)
    g2 = torch.Generator()
    assert carbon.load(path, generator=g2) == {"note": "x"}
    assert torch.equal(torch.randn(4, generator=g2), expected)

    class DuckGenerator:  # the carbon.Generator API: get_state() / set_state(tensor)
        def __init__(self):
            self.state = torch.tensor([7, 8], dtype=torch.uint8)

        def get_state(self):
            return self.state.clone()

        def set_state(self, state):
            self.state = state.clone()

    duck = DuckGenerator()
    carbon.save(path, generator=duck)
    other = DuckGenerator()
    other.state = torch.zeros(2, dtype=torch.uint8)
    carbon.load(path, generator=other)
    assert torch.equal(other.state, duck.state)


def test_load_errors(tmp_path):
    path = str(tmp_path / "plain.pt")
    torch.save({"a": 1}, path)
    import pytest
    with pytest.raises(ValueError, match="not a carbon checkpoint"):
        carbon.load(path)
    carbon.save(path)
    with pytest.raises(ValueError, match="no model state"):
        carbon.load(path, model=torch.nn.Linear(2, 2))
