"""The CUDA emulator itself (tests/cuda_emulator/), before any op is trusted to it: its warp collectives and
barriers return what CUDA's do (each value derived here from the CUDA programming guide's definitions), a
missing barrier changes the result, and the misuses a GPU would answer with a hang or garbage are reported."""

import pytest
import torch

from emulated import emulated_ops


def expected_collectives():
    """The table of emulator_selftest.cpp's collectives_kernel (a block of 64 threads = two warps)."""
    rows = [[] for _ in range(11)]
    for t in range(64):
        lane, base = t % 32, t - t % 32
        rows[0].append(t ^ 5)
        rows[1].append(base + 3)
        rows[2].append(t + 3 if lane + 3 < 32 else t)
        rows[3].append(t - 3 if lane >= 3 else t)
        src = lane ^ 9  # width 8: a lane may read an earlier group of 8, never a later one
        rows[4].append(base + src if src < lane // 8 * 8 + 8 else t)
        rows[5].append(t + 3 if lane % 8 + 3 < 8 else t)
        rows[6].append(sum(1 << k for k in range(32) if k % 2))
        rows[7].append(1)  # some lane of each warp is lane 30
        rows[8].append(0)  # lane 31 is not < 31
        rows[9].append(1)  # thread 7 is in the block
        rows[10].append(32)  # odd threads of 64
    return torch.tensor(rows, dtype=torch.long)


def test_collectives_match_cuda_definitions():
    got = emulated_ops()._emu_collectives()
    want = expected_collectives()
    bad = (got != want).nonzero().tolist()
    assert not bad, f"collective (row) / thread (column) that differ: {bad[:8]}"


def test_a_missing_barrier_changes_the_result():
    ops = emulated_ops()
    want = torch.tensor([((t + 1) % 128 + 1) + ((t + 127) % 128 + 1) for t in range(128)])
    for seed in range(4):
        assert torch.equal(ops._emu_neighbour_sum(False, seed), want), f"with the barrier, schedule seed {seed}"
    buggy = [ops._emu_neighbour_sum(True, seed) for seed in range(4)]
    assert any(not torch.equal(b, want) for b in buggy), "without the barrier every schedule gave the right answer"


@pytest.mark.parametrize("kind, message", [
    (0, "deadlock"),
    (1, "exit"),  # reported by whichever comes first: the exit or the shuffle
    (2, "different warp collectives"),
    (3, "different kinds of barrier"),
    (4, "outside the mask"),
    (5, "empty grid"),
])
def test_misuse_is_reported(kind, message):
    ops = emulated_ops()
    with pytest.raises(RuntimeError, match=message):
        ops._emu_misuse(kind)
    # The emulator is usable again afterwards.
    assert torch.equal(ops._emu_collectives(), expected_collectives())


def test_launches_are_counted():
    ops = emulated_ops()
    before = int(ops._emu_launches())
    ops._emu_collectives()
    assert int(ops._emu_launches()) == before + 1
