"""Bit-exact resume (contract §12): N training steps in one go equal k steps,
carbon.save, carbon.load in a fresh Python process, and N - k more steps:
the SHA-256 of every parameter and optimizer state agrees -- and, with dropout,
the state of the carbon.Generator its masks come from."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
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


@pytest.fixture
def keep_default_generator():
    """carbon.default_generator's state as it was before the test, restored after it."""
    state = carbon.default_generator.get_state()
    yield
    carbon.default_generator.set_state(state)


def test_resume_under_enable_in_a_fresh_process(tmp_path, keep_default_generator):
    """The main flow: plain torch.nn (Linear, GELU, Dropout) and torch.optim.AdamW trained under
    carbon.enabled(seed=...), whose init and dropout masks come from carbon.default_generator and whose AdamW
    step is carbon's. k steps, carbon.save(model, optimizer, generator=carbon.default_generator), and in a fresh
    process: enable (another seed), build, carbon.load -- after enabling, so the loaded generator wins -- and
    N - k more steps give the straight run's weights, optimizer state and generator state, bit for bit."""
    data = resume_helper.plain_batches(N)
    with carbon.enabled(seed=resume_helper.ENABLE_SEED):
        model, opt = resume_helper.make_plain()
        init_draws = carbon.default_generator.offset  # the Linear layers' init: one draw per weight and bias
        assert init_draws == 4
        resume_helper.train_plain(model, opt, data, 0, N)
    straight = resume_helper.digest(model, opt)
    # seed, then offset: the init's draws and one dropout mask per step
    straight_generator = struct.pack("<QQ", resume_helper.ENABLE_SEED, init_draws + N).hex()
    assert resume_helper.generator_state(carbon.default_generator) == straight_generator

    with carbon.enabled(seed=resume_helper.ENABLE_SEED):
        model, opt = resume_helper.make_plain()
        resume_helper.train_plain(model, opt, data, 0, K)
        path = str(tmp_path / "ckpt.pt")
        carbon.save(path, model=model, optimizer=opt, generator=carbon.default_generator, step=K)
    assert resume_helper.digest(model, opt) != straight  # the remaining steps do change the bits
    saved_generator = carbon.default_generator.get_state()
    assert _in_a_fresh_process(f"resume_plain({path!r}, {K}, {N})")[-2:] == [straight, straight_generator]

    # The generator matters. Resumed from the same checkpoint with the model and optimizer only, under
    # carbon.enabled(seed=...) (which reseeds the default generator; the init then draws 4 masks' worth), steps
    # k.. draw other masks and the weights differ ...
    with carbon.enabled(seed=resume_helper.ENABLE_SEED):
        fresh_model, fresh_opt = resume_helper.make_plain()
        carbon.load(path, model=fresh_model, optimizer=fresh_opt)
        resume_helper.train_plain(fresh_model, fresh_opt, data, K, N)
    assert resume_helper.digest(fresh_model, fresh_opt) != straight
    # ... and so they do when the generator is loaded first and carbon.enabled(seed=...) then reseeds it.
    with carbon.enabled():
        fresh_model, fresh_opt = resume_helper.make_plain()
    carbon.load(path, model=fresh_model, optimizer=fresh_opt, generator=carbon.default_generator)
    with carbon.enabled(seed=resume_helper.ENABLE_SEED):
        resume_helper.train_plain(fresh_model, fresh_opt, data, K, N)
    assert resume_helper.digest(fresh_model, fresh_opt) != straight

    # in-process continuation too (sanity): carbon.enabled() without a seed keeps the generator's state
    carbon.default_generator.set_state(saved_generator)
    with carbon.enabled():
        resume_helper.train_plain(model, opt, data, K, N)
    assert resume_helper.digest(model, opt) == straight
    assert resume_helper.generator_state(carbon.default_generator) == straight_generator


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


def test_save_load_several_generators(tmp_path):
    """A list of generators (carbon's default stream and a dropout stream,
    say) is saved and restored in order: each continues its own sequence,
    against the independent Philox reference for the carbon ones."""
    path = str(tmp_path / "gs.pt")
    a, b, t = carbon.Generator(seed=11), carbon.Generator(seed=2**63 + 5), torch.Generator().manual_seed(4)
    carbon.rand(3, generator=a)
    for _ in range(2):
        carbon.rand(3, generator=b)
    torch.rand(2, generator=t)
    carbon.save(path, generator=[a, b, t])
    a2, b2, t2 = carbon.Generator(seed=0), carbon.Generator(seed=0), torch.Generator()
    carbon.load(path, generator=(a2, b2, t2))
    for seed, offset, g in ((11, 1, a2), (2**63 + 5, 2, b2)):
        assert [x & 0xFFFFFFFF for x in as_bits(carbon.rand(4, generator=g)).tolist()] == _uniform_bits(seed, offset, 4)
    assert torch.equal(torch.rand(3, generator=t2), torch.rand(3, generator=t))
    with pytest.raises(ValueError, match="has 3 generator states, got 2 generators"):
        carbon.load(path, generator=[a2, b2])
    with pytest.raises(ValueError, match="no generator state .it has a list of generators"):
        carbon.load(path, generator=a2)


def test_load_errors(tmp_path):
    path = str(tmp_path / "plain.pt")
    torch.save({"a": 1}, path)
    import pytest
    with pytest.raises(ValueError, match="not a carbon checkpoint"):
        carbon.load(path)
    carbon.save(path)
    with pytest.raises(ValueError, match="no model state"):
        carbon.load(path, model=torch.nn.Linear(2, 2))
