"""Bit-exact resume (contract §12): N training steps in one go equal k steps,
carbon.save, carbon.load in a fresh Python process, and N - k more steps:
the SHA-256 of every parameter and optimizer state agrees -- and, with dropout,
the state of the carbon.Generator its masks come from."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import torch

import carbon
import philox_reference as ref
import resume_helper
from oracle import as_bits, round_bits

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


def _in_a_fresh_process(call: str) -> list:
    """Run ``resume_helper.<call>`` in a new Python process; its output lines."""
    code = f"import sys; sys.path.insert(0, 'tests'); import resume_helper; resume_helper.{call}"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()


def test_resume_with_dropout_and_its_generator_in_a_fresh_process(tmp_path):
    """The model drops out with masks from a carbon.Generator; carbon.save / carbon.load carry the generator's
    state with the model's and the optimizer's, so the masks of steps k.. after a resume in another process
    are those of the straight run: same weights, optimizer state and generator state."""
    model, opt, generator = resume_helper.make_with_dropout()
    resume_helper.train(model, opt, 0, N)
    # one mask per step, drawn from this generator (not carbon.default_generator): seed and offset N,
    # little-endian uint64 each
    straight_generator = resume_helper.generator_state(generator)
    assert straight_generator == struct.pack("<QQ", resume_helper.DROPOUT_SEED, N).hex()
    straight = resume_helper.digest(model, opt)

    model, opt, generator = resume_helper.make_with_dropout()
    resume_helper.train(model, opt, 0, K)
    path = str(tmp_path / "ckpt.pt")
    carbon.save(path, model=model, optimizer=opt, generator=generator, step=K)
    assert resume_helper.digest(model, opt) != straight  # the remaining steps do change the bits
    assert _in_a_fresh_process(f"resume_with_dropout({path!r}, {K}, {N})")[-2:] == [straight, straight_generator]

    # The generator matters: resumed from the same checkpoint with the model and optimizer only (the
    # generator fresh at its seed), steps k.. draw the masks of steps 0.. and the weights differ.
    fresh_model, fresh_opt, fresh_generator = resume_helper.make_with_dropout()
    carbon.load(path, model=fresh_model, optimizer=fresh_opt)
    resume_helper.train(fresh_model, fresh_opt, K, N)
    assert fresh_generator.offset == N - K
    assert resume_helper.digest(fresh_model, fresh_opt) != straight

    # in-process continuation too (sanity)
    resume_helper.train(model, opt, K, N)
    assert resume_helper.digest(model, opt) == straight
    assert resume_helper.generator_state(generator) == straight_generator


def _uniform_bits(seed: int, offset: int, n: int) -> list:
    """carbon.rand(n)'s float32 bits at (seed, offset), from the independent Philox reference."""
    return [round_bits(ref.uniform01(w), torch.float32) for w in ref.words(seed, offset, n)]


def test_carbon_generator_round_trips_through_save_load(tmp_path):
    """A CPU carbon.Generator saved by carbon.save and loaded by carbon.load into another generator: the same
    state (a seed above 2**63, an offset past 32 bits) and the same next draws, which are the reference's."""
    path = str(tmp_path / "carbon_generator.pt")
    seed = 2**64 - 5
    g = carbon.Generator(seed=seed)
    g.offset = 2**33 + 1
    carbon.rand(10, generator=g)
    carbon.dropout(torch.ones(7), 0.5, generator=g)
    offset = 2**33 + 3
    carbon.save(path, generator=g, step=4)

    other = carbon.Generator(seed=1)
    carbon.rand(3, generator=other)
    assert carbon.load(path, generator=other) == {"step": 4}
    assert bytes(other.get_state().tolist()) == struct.pack("<QQ", seed, offset)
    assert other.device.type == "cpu" and other.initial_seed() == seed and other.offset == offset
    want = _uniform_bits(seed, offset, 9)
    for gen in (g, other):
        assert [b & 0xFFFFFFFF for b in as_bits(carbon.rand(9, generator=gen)).tolist()] == want
    assert torch.equal(as_bits(carbon.randn(5, generator=other)), as_bits(carbon.randn(5, generator=g)))
    assert other.offset == g.offset == offset + 2


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
