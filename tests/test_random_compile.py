"""carbon.Generator under torch.compile and in CUDA graphs (docs/contract.md
§10): the generator's state is a tensor that each draw copies and advances in
place, so a compiled function that draws compiles once and then, call after
call, gives exactly the eager sequence of values -- itself checked against the
independent Philox reference (tests/philox_reference.py). The CUDA tests
(skipped without a GPU) capture draws in a CUDA graph and check that no draw
waits for the device."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import carbon
import philox_reference as ref
from oracle import as_bits, fmt_of, round_bits

CALLS = 12  # more than dynamo's recompile limit (8)
SEED = 2**63 + 2024
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def bits(t: torch.Tensor) -> list:
    mask = (1 << fmt_of(t.dtype).total_bits) - 1
    return [b & mask for b in as_bits(t.detach().cpu()).reshape(-1).tolist()]


def uniform_bits(seed: int, offset: int, n: int, dtype=torch.float32) -> list:
    return [round_bits(ref.uniform01(w), dtype) for w in ref.words(seed, offset, n)]


class Block(torch.nn.Module):
    """A linear layer, dropout, and an exact sum: the draws of a training step."""

    def __init__(self, generator: carbon.Generator) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.linear = carbon.nn.Linear(8, 8)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(8, 8, generator=g))
            self.linear.bias.copy_(torch.randn(8, generator=g))
        self.drop = carbon.nn.Dropout(0.25, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.linear(x))


def draws(block: Block, g: carbon.Generator, x: torch.Tensor, weights: torch.Tensor):
    """Four draws (rand, randn, trunc_normal, bernoulli) and the dropout of
    ``block``'s forward; the backward regenerates the dropout's mask."""
    u = carbon.rand(5, generator=g)
    z = carbon.randn(6, generator=g, dtype=torch.bfloat16)
    t = carbon.random.trunc_normal((7,), 0.0, 1.0, -0.5, 1.0, generator=g)
    b = carbon.bernoulli(torch.full((9,), 0.5), generator=g)
    y = block(x)
    loss = carbon.sum(y * weights)
    return u, z, t, b, y, loss


def step(fn, block: Block, g: carbon.Generator, x: torch.Tensor, weights: torch.Tensor) -> list:
    """One call's outputs and gradients, as bits."""
    block.zero_grad(set_to_none=True)
    u, z, t, b, y, loss = fn(block, g, x, weights)
    loss.backward()
    return [bits(v) for v in (u, z, t, b, y, block.linear.weight.grad, block.linear.bias.grad)]


def run_sequence(backend, device="cpu"):
    """CALLS steps of the compiled function (or eager when backend is None):
    the outputs, the offsets after each call, and the compile count."""
    torch._dynamo.reset()
    g = carbon.Generator(device=device, seed=SEED)
    block = Block(g).to(device)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)).to(device)
    weights = torch.randn(4, 8, generator=torch.Generator().manual_seed(2)).to(device)
    counter = None
    fn = draws
    if backend is not None:
        counter = CompileCounterWithBackend(backend)
        fn = torch.compile(draws, backend=counter, fullgraph=True)
    outputs, offsets = [], []
    for _ in range(CALLS):
        outputs.append(step(fn, block, g, x, weights))
        offsets.append(g.offset)
    return outputs, offsets, counter, (block, x, weights)


@pytest.fixture(scope="module")
def eager_cpu():
    return run_sequence(None)


def test_eager_sequence_is_the_reference(eager_cpu):
    outputs, offsets, _, (block, x, _) = eager_cpu
    assert offsets == [5 * (k + 1) for k in range(CALLS)]  # five draws per call
    with torch.no_grad():
        h = block.linear(x)
    for k, (u, _, _, b, y, *_) in enumerate(outputs):
        base = 5 * k
        assert u == uniform_bits(SEED, base, 5)
        half = [int(ref.uniform01(w) < Fraction(1, 2)) for w in ref.words(SEED, base + 3, 9)]
        assert [1 if v else 0 for v in b] == half
        assert y == ref.dropout_bits(h, 0.25, SEED, base + 4)
    assert len({tuple(o[0]) for o in outputs}) == CALLS  # every call draws anew


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_draws_compile_once_and_match_eager(backend, eager_cpu):
    outputs, offsets, counter, _ = run_sequence(backend)
    assert counter.frame_count == 1
    assert offsets == eager_cpu[1]
    for k, (got, want) in enumerate(zip(outputs, eager_cpu[0])):
        assert got == want, k


def test_reseeding_between_compiled_calls():
    # the seed is in the state tensor too: reseeding neither recompiles nor is ignored
    torch._dynamo.reset()
    g = carbon.Generator(seed=1)
    counter = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda: carbon.rand(6, generator=g), backend=counter, fullgraph=True)
    first = f()
    g.manual_seed(2)
    assert bits(f()) == uniform_bits(2, 0, 6)
    g.manual_seed(1)
    assert torch.equal(f(), first) and g.offset == 1
    g.set_state(carbon.Generator(seed=5).get_state())
    g.offset = 9
    assert bits(f()) == uniform_bits(5, 9, 6)
    assert counter.frame_count == 1


# ---------------------------------------------------------------- the state tensor


def test_state_overloads_equal_int_overloads():
    cpu = torch.device("cpu")
    seed, offset = -(2**62) + 3, 2**40 + 1  # a seed >= 2**63, as its int64
    state = torch.tensor([seed, offset])
    ops = torch.ops.carbon
    pairs = [
        (ops.uniform.state([33], state, -1.0, 2.0, torch.float32, cpu), ops.uniform([33], seed, offset, -1.0, 2.0,
                                                                                    torch.float32, cpu)),
        (ops.normal.state([33], state, 0.5, 2.0, torch.float16, cpu), ops.normal([33], seed, offset, 0.5, 2.0,
                                                                                 torch.float16, cpu)),
        (ops.trunc_normal.state([9], state, 0.0, 1.0, -1.0, 1.0, torch.bfloat16, cpu),
         ops.trunc_normal([9], seed, offset, 0.0, 1.0, -1.0, 1.0, torch.bfloat16, cpu)),
        (ops.bernoulli.state(torch.full((33,), 0.3), state, None), ops.bernoulli(torch.full((33,), 0.3), seed, offset)),
        (ops.dropout.state(torch.ones(33), 0.3, state), ops.dropout(torch.ones(33), 0.3, seed, offset)),
    ]
    for got, want in pairs:
        assert bits(got) == bits(want)
    assert bits(pairs[0][1]) == [round_bits(-1.0 + 3.0 * float(ref.uniform01(w)), torch.float32)
                                 for w in ref.words(seed, offset, 33)]
    strided = torch.tensor([seed, 0, offset, 0])[::2]  # a non-contiguous state on the host is read as well
    assert bits(ops.uniform.state([33], strided, -1.0, 2.0, torch.float32, cpu)) == bits(pairs[0][1])


def test_state_errors():
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="carbon.uniform: offset"):
        torch.ops.carbon.uniform.state([3], torch.tensor([0, -1]), 0.0, 1.0, torch.float32, cpu)
    with pytest.raises(TypeError, match="carbon.dropout: state must be an int64"):
        torch.ops.carbon.dropout.state(torch.ones(3), 0.5, torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="carbon.bernoulli: state .* shape"):
        torch.ops.carbon.bernoulli.state(torch.ones(3), torch.tensor([0, 1, 2]), None)
    with pytest.raises(ValueError, match="device"):
        carbon.Generator(device="meta")


def test_next_state_is_a_copy_and_the_state_is_written_in_place():
    g = carbon.Generator(seed=7)
    held = g._state  # what compiled code and captured CUDA graphs hold
    s0 = g.next_state()
    s1 = g.next_state()
    assert s0.tolist() == [7, 0] and s1.tolist() == [7, 1] and g.offset == 2
    g.manual_seed(2**64 - 1)
    assert g._state is held and held.tolist() == [-1, 0] and g.initial_seed() == 2**64 - 1
    g.offset = 5
    g.set_state(carbon.Generator(seed=3).get_state())
    assert g._state is held and held.tolist() == [3, 0]
    assert s0.tolist() == [7, 0]
    assert g.next_draw() == (3, 0) and g.offset == 1  # the int form, for host code


def test_generator_made_in_inference_mode_draws_outside():
    with torch.inference_mode():
        g = carbon.Generator(seed=4)
        inside = carbon.rand(3, generator=g)
    outside = carbon.rand(3, generator=g)
    assert bits(inside) == uniform_bits(4, 0, 3) and bits(outside) == uniform_bits(4, 1, 3)


# ---------------------------------------------------------------- CUDA


@pytest.mark.cuda
@cuda_only
def test_cuda_generator_draws_match_cpu_and_never_sync():
    gpu, host = carbon.Generator("cuda", seed=SEED), carbon.Generator(seed=SEED)  # state on the GPU / the host
    x = torch.randn(1000)
    xg = x.cuda()
    results = []
    torch.cuda.set_sync_debug_mode("error")  # a synchronizing CUDA call raises
    try:
        for g in (gpu, host):
            results.append([carbon.rand(1001, device="cuda", generator=g),
                            carbon.randn(1001, device="cuda", dtype=torch.float16, generator=g),
                            carbon.dropout(xg, 0.3, generator=g)])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cpu = carbon.Generator(seed=SEED)
    want = [carbon.rand(1001, generator=cpu), carbon.randn(1001, dtype=torch.float16, generator=cpu),
            carbon.dropout(x, 0.3, generator=cpu)]
    for got in results:
        assert [bits(t) for t in got] == [bits(t) for t in want]
    assert gpu.offset == host.offset == cpu.offset == 3
    # a CPU draw from a CUDA generator copies the state to the host (and waits)
    assert bits(carbon.rand(7, generator=gpu)) == bits(carbon.rand(7, generator=cpu))


@pytest.mark.cuda
@cuda_only
def test_cuda_graph_replays_advance_the_generator():
    g = carbon.Generator("cuda", seed=SEED)
    x = torch.randn(4099, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (one draw each)
        carbon.rand(4099, device="cuda", generator=g)
        carbon.dropout(x, 0.4, generator=g)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        u = carbon.rand(4099, device="cuda", generator=g)
        y = carbon.dropout(x, 0.4, generator=g)
    assert g.offset == 2  # captured, not run
    for replay in range(3):
        graph.replay()
        torch.cuda.synchronize()
        offset = 2 + 2 * replay
        assert bits(u) == uniform_bits(SEED, offset, 4099)
        assert bits(y) == ref.dropout_bits(x, 0.4, SEED, offset + 1)
        assert g.offset == offset + 2


@pytest.mark.cuda
@cuda_only
def test_cuda_graph_refuses_a_host_state():
    g = carbon.Generator(seed=1)  # state in host memory: would be frozen into the graph
    carbon.rand(8, device="cuda", generator=g)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="captured in a CUDA graph"):
        with torch.cuda.graph(graph):
            carbon.rand(8, device="cuda", generator=g)


@pytest.mark.cuda
@cuda_only
def test_cuda_compiled_draws_compile_once_and_match_eager():
    eager, eager_offsets, _, _ = run_sequence(None, "cuda")
    outputs, offsets, counter, _ = run_sequence("inductor", "cuda")
    assert counter.frame_count == 1 and offsets == eager_offsets
    assert outputs == eager
    cpu_outputs = run_sequence(None, "cpu")[0]
    assert [o[:5] for o in eager] == [o[:5] for o in cpu_outputs]  # the draws: the same bits as on the CPU


def test_compiled_attention_dropout_draws_from_the_default_generator():
    # carbon.scaled_dot_product_attention's dropout draws from the module-level
    # default generator: a global the compiled graph reads and advances
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 5, 4, generator=g) for _ in range(3))

    def attend(q, k, v):
        return carbon.scaled_dot_product_attention(q, k, v, dropout_p=0.3)

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(attend, backend=counter, fullgraph=True)
    carbon.manual_seed(11)
    got = [bits(compiled(q, k, v)) for _ in range(CALLS)]
    assert carbon.default_generator.offset == CALLS
    carbon.manual_seed(11)
    assert got == [bits(attend(q, k, v)) for _ in range(CALLS)]
    assert counter.frame_count == 1
