"""carbon.index_add / carbon.scatter_add: every destination element is
RN(exact sum of its old value and all of its contributions), one rounding,
whatever the order or duplication of the indices (docs/contract.md §11).
Results are compared bit for bit with the exact oracle
(scatter_reference.py, built on oracle.row_sum_bits)."""

import math
import os
import subprocess
import sys

import pytest
import torch

import carbon
from data import BF16, DTYPES, F16, F32, exact_tensor, generator, random_values, seed_of
from oracle import as_bits, assert_bits_equal, fmt_of
from scatter_reference import index_add_bits, scatter_add_bits

INF, NAN = math.inf, math.nan
BIG = {F32: 2.0**100, BF16: 2.0**100, F16: 2.0**14}
TINY = {F32: 2.0**-140, BF16: 2.0**-130, F16: 2.0**-24}


def heavy_index(n, size, g):
    """n indices into [0, size), most of them hitting two destinations."""
    hot = torch.randint(0, size, (2,), generator=g)
    idx = torch.randint(0, size, (n,), generator=g)
    pick = torch.rand(n, generator=g) < 0.6
    return torch.where(pick, hot[torch.randint(0, 2, (n,), generator=g)], idx)


def check_index_add(self, dim, index, source, context=""):
    out = carbon.index_add(self, dim, index, source)
    assert_bits_equal(out, index_add_bits(self, dim, index, source), context, dtype=self.dtype)
    return out


# ---------------------------------------------------------------- index_add vs the oracle

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_index_add_random_heavy_duplicates(dtype, dim):
    g = generator(seed_of(str(dtype), dim))
    shape = [4, 5, 6]
    S = shape[dim]
    n = 23
    src_shape = list(shape)
    src_shape[dim] = n
    self = random_values(shape, dtype, g)
    source = random_values(src_shape, dtype, g)
    index = heavy_index(n, S, g)
    check_index_add(self, dim, index, source, f"{dtype} dim {dim}")
    check_index_add(self, dim, index.int(), source, "int32 index")


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_add_order_of_contributions_does_not_matter(dtype):
    g = generator(7)
    self = random_values((3, 40), dtype, g)
    source = random_values((200, 40), dtype, g, spread=30 if dtype != F16 else 6)
    index = heavy_index(200, 3, g)
    ref = check_index_add(self, 0, index, source)
    for seed in range(3):
        perm = torch.randperm(200, generator=generator(seed))
        out = carbon.index_add(self, 0, index[perm], source[perm])
        assert torch.equal(as_bits(out), as_bits(ref)), f"permutation {seed} changed the bits"


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_add_cancellation_and_ties(dtype):
    big, tiny = BIG[dtype], TINY[dtype]
    p = fmt_of(dtype).precision
    half_ulp = 2.0 ** -p  # 1 + half_ulp is a tie between 1 and its successor
    # destination 0: big - big cancels, leaving 1 + tie + tiny: rounds up (fp64 would see a tie)
    # destination 1: the same with -tiny: rounds down to 1
    # destination 2: big + x - big: only x survives
    # destination 3: tie with nothing else: ties to even (1)
    rows = [[big], [-big], [half_ulp], [tiny], [big], [-big], [half_ulp], [-tiny], [big], [3.0], [-big], [half_ulp]]
    dest = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3]
    source = exact_tensor(rows, dtype)
    self = exact_tensor([[1.0], [1.0], [0.0], [1.0]], dtype)
    index = torch.tensor(dest)
    out = check_index_add(self, 0, index, source, "cancellation / ties")
    assert out[0, 0].item() > 1.0 and out[1, 0].item() == 1.0 and out[2, 0].item() == 3.0 and out[3, 0].item() == 1.0
    # the old value is inside the one rounding: a tie made by self + source
    self2 = exact_tensor([[1.0]], dtype)
    src2 = exact_tensor([[half_ulp], [tiny], [-tiny], [tiny]], dtype)
    check_index_add(self2, 0, torch.zeros(4, dtype=torch.long), src2, "tie broken by tiny terms")


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_add_ties_near_the_exactness_limits(dtype):
    # Destination 2e adds 1 + half an ulp (a tie of f) + 2^-e (1 + 2^(1-p)) - 2^-e in column 0, the
    # same with the last two terms negated in column 1: exact sums 2^(1-p-e) above and below the
    # tie. In this order a float format of q significand bits sums them exactly while e <= q - p
    # and from e = q - p + 1 on loses that remainder, leaving exactly the tie. The CPU kernel's
    # tier 1 takes its sum in such a format (float64; float32 for 16-bit formats) as exact only
    # while the smallest term is above 2^(p-q+1) times the absolute sum (e < q - 1 - p here): e on
    # both sides of those limits for q = 53 and q = 24, one destination each (the kernel decides
    # groups of columns together). Destination 2e + 1 adds the same terms in the opposite order.
    p = fmt_of(dtype).precision
    es = range(1, 60 - p if dtype != F16 else 15)  # 2^-e (1 + 2^(1-p)) a normal number of f
    rows, dest = [], []
    for k, e in enumerate(es):
        terms = [[2.0**-p] * 2, [2.0**-e * (1 + 2.0 ** (1 - p)), -(2.0**-e) * (1 + 2.0 ** (1 - p))],
                 [-(2.0**-e), 2.0**-e]]
        rows += terms + terms[::-1]
        dest += [2 * k] * 3 + [2 * k + 1] * 3
    self = exact_tensor([[1.0, 1.0]] * (2 * len(es)), dtype)
    out = check_index_add(self, 0, torch.tensor(dest), exact_tensor(rows, dtype), "ties near the exactness limits")
    assert bool((out[:, 0] > 1.0).all()) and bool((out[:, 1] == 1.0).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_add_specials_and_signed_zeros(dtype):
    Z = -0.0
    cases = [  # (self, contributions)
        (Z, [Z, Z]),        # every term -0 -> -0
        (Z, []),            # the old value alone -> -0
        (0.0, [Z]),         # a +0 term -> +0
        (Z, [0.0]),
        (1.0, [-1.0]),      # cancellation -> +0
        (Z, [2.0, -2.0]),
        (NAN, []),          # canonical NaN
        (1.0, [INF, 2.0]),
        (1.0, [INF, -INF]),
        (-INF, [3.0]),
        (1.0, [NAN, INF]),
        (INF, [-INF]),
    ]
    self = exact_tensor([[c[0]] for c in cases], dtype)
    rows, dest = [], []
    for j, (_, contrib) in enumerate(cases):
        for v in contrib:
            rows.append([v])
            dest.append(j)
    out = check_index_add(self, 0, torch.tensor(dest), exact_tensor(rows, dtype), "specials")
    assert math.copysign(1.0, out[0, 0].item()) < 0 and math.copysign(1.0, out[2, 0].item()) > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_add_overflow_and_subnormals(dtype):
    f = fmt_of(dtype)
    top = {F32: 2.0**127, BF16: 2.0**127, F16: 2.0**15}[dtype]
    q = 2.0 ** f.quantum_exp  # the quantum
    self = exact_tensor([[top], [q], [-q]], dtype)
    source = exact_tensor([[top], [-top], [q], [q], [-q]], dtype)
    check_index_add(self, 0, torch.tensor([0, 0, 1, 1, 2]), source, "overflow / subnormals")


def test_index_add_empty_index_and_empty_tensors():
    g = generator(3)
    self = exact_tensor([[1.0, NAN], [-0.0, 2.5]], F32)
    out = check_index_add(self, 0, torch.tensor([], dtype=torch.long), torch.empty(0, 2), "empty index")
    assert as_bits(out)[0, 1].item() == fmt_of(F32).nan_bits
    e = carbon.index_add(torch.empty(0, 3), 1, torch.tensor([0, 1]), torch.empty(0, 2))
    assert e.shape == (0, 3)
    x = random_values((5,), BF16, g)
    check_index_add(x, 0, torch.tensor(2), random_values((1,), BF16, g), "0-d index")


def test_index_add_layouts_and_threads(restore_num_threads):
    g = generator(11)
    self = random_values((8, 6), F32, g).t()  # (6, 8) transposed view
    source = random_values((30, 6), F32, g, spread=40).t()[:, ::1]  # (6, 30) strided
    index = heavy_index(30, 8, g)
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outs.append(check_index_add(self, 1, index, source, f"{threads} threads"))
    assert torch.equal(as_bits(outs[0]), as_bits(outs[1]))


def test_index_add_threads_split_destinations(restore_num_threads):
    # enough destination rows that the CPU kernel splits them over 2 threads
    g = generator(17)
    self = random_values((120, 200), F32, g)
    source = random_values((300, 200), F32, g, spread=40)
    index = heavy_index(300, 120, g)
    expected = index_add_bits(self, 0, index, source)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        assert_bits_equal(carbon.index_add(self, 0, index, source), expected, f"{threads} threads")


def test_index_add_many_columns():  # several column blocks of the CPU kernel
    g = generator(5)
    self = random_values((3, 600), F32, g)
    source = random_values((9, 600), F32, g)
    check_index_add(self, 0, torch.tensor([0, 2, 2, 0, 1, 2, 2, 0, 0]), source, "600 columns")


def test_index_add_alpha():
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="alpha"):
        carbon.index_add(x, 0, torch.tensor([0]), torch.ones(1), alpha=2.0)
    assert torch.equal(carbon.index_add(x, 0, torch.tensor([0]), torch.ones(1), alpha=1), torch.tensor([1.0, 0.0]))


# ---------------------------------------------------------------- scatter_add

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_add_random(dtype, dim):
    g = generator(seed_of("scatter", str(dtype), dim))
    self = random_values((4, 5), dtype, g)
    src = random_values((6, 7), dtype, g)
    size = self.shape[dim]
    ishape = (6, 5) if dim == 0 else (4, 7)  # index no larger than src, nor than self outside dim
    index = torch.randint(0, size, ishape, generator=g)
    out = carbon.scatter_add(self, dim, index, src)
    assert_bits_equal(out, scatter_add_bits(self, dim, index, src), f"scatter_add {dtype} dim {dim}", dtype=dtype)


def test_scatter_add_adversarial_and_empty():
    big, h = 2.0**100, 2.0**-24
    self = exact_tensor([[1.0, -0.0], [NAN, 5.0]], F32)
    src = exact_tensor([[big, h, -0.0], [-big, 2.0**-90, 1.0]], F32)
    index = torch.tensor([[0, 0, 1], [0, 0, 1]])
    out = carbon.scatter_add(self, 1, index[:, :2], src)
    assert_bits_equal(out, scatter_add_bits(self, 1, index[:, :2], src), "scatter_add ties")
    empty = carbon.scatter_add(self, 0, torch.empty(0, dtype=torch.long), src)
    assert_bits_equal(empty, scatter_add_bits(self, 0, torch.empty(0, 0, dtype=torch.long), src), "empty index")


# ---------------------------------------------------------------- index_put (accumulate=True, one index on dim 0)

@pytest.mark.parametrize("dtype", DTYPES)
def test_index_put_accumulate(dtype):
    g = generator(40)
    self = random_values((5, 3), dtype, g)
    index = heavy_index(17, 5, g)
    values = random_values((17, 3), dtype, g)
    out = carbon.index_put(self, (index,), values, accumulate=True)
    assert_bits_equal(out, index_add_bits(self, 0, index, values), "index_put", dtype=dtype)
    row = random_values((3,), dtype, g)  # broadcast values
    out = carbon.index_put(self, [index], row)
    assert_bits_equal(out, index_add_bits(self, 0, index, row.expand(17, 3)), "index_put broadcast", dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_forms(dtype):
    """carbon.index_add_ / scatter_add_ / index_put_ write the exact sums into
    self and return it, in a graph too (the gradients pass through)."""
    g = generator(41)
    base = random_values((5, 3), dtype, g)
    index = heavy_index(17, 5, g)
    source = random_values((17, 3), dtype, g)
    want = index_add_bits(base, 0, index, source)
    for name, call in [("index_add_", lambda t: carbon.index_add_(t, 0, index, source)),
                       ("index_put_", lambda t: carbon.index_put_(t, (index,), source, accumulate=True))]:
        t = base.clone()
        assert call(t) is t
        assert_bits_equal(t, want, name, dtype=dtype)
    scatter_index = torch.randint(0, 5, (6, 3), generator=g)
    src = random_values((6, 3), dtype, g)
    t = base.clone()
    assert carbon.scatter_add_(t, 0, scatter_index, src) is t
    assert_bits_equal(t, scatter_add_bits(base, 0, scatter_index, src), "scatter_add_", dtype=dtype)
    leaf = base.clone().requires_grad_()
    src_leaf = source.clone().requires_grad_()
    out = carbon.index_add_(leaf * 1, 0, index, src_leaf)
    out.backward(torch.ones_like(out))
    assert torch.equal(leaf.grad, torch.ones_like(base)) and torch.equal(src_leaf.grad, torch.ones_like(source))


@pytest.mark.cpu_kernels
def test_index_put_errors():
    x = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="carbon.index_put:"):
        carbon.index_put(x, (torch.tensor([0]),), torch.ones(1, 2), accumulate=False)
    with pytest.raises(ValueError, match="carbon.index_put:"):
        carbon.index_put(x, (torch.tensor([0]), torch.tensor([1])), torch.ones(1))
    with pytest.raises(ValueError, match="carbon.index_put:"):
        carbon.index_put(x, (torch.tensor([0, 1]),), torch.ones(3, 2))
    with pytest.raises(TypeError, match="carbon.index_put:"):
        carbon.index_put(x, (torch.tensor([0.0]),), torch.ones(1, 2))
    with pytest.raises(IndexError, match="carbon.index_add:"):
        carbon.index_put(x, (torch.tensor([-1]),), torch.ones(1, 2))


# ---------------------------------------------------------------- gradients, tracing, errors

def test_index_add_autograd():
    g = generator(9)
    self = random_values((4, 3), F32, g).requires_grad_()
    source = random_values((6, 3), F32, g).requires_grad_()
    index = torch.tensor([1, 1, 3, 0, 1, 3])
    out = carbon.index_add(self, 0, index, source)
    grad = random_values((4, 3), F32, g)
    out.backward(grad)
    assert torch.equal(self.grad, grad)
    assert torch.equal(source.grad, grad[index])


def test_scatter_add_autograd():
    g = generator(10)
    self = random_values((3, 4), BF16, g).requires_grad_()
    src = random_values((3, 6), BF16, g).requires_grad_()
    index = torch.randint(0, 4, (2, 5), generator=g)
    out = carbon.scatter_add(self, 1, index, src)
    grad = random_values((3, 4), BF16, g)
    out.backward(grad)
    expected = torch.zeros(3, 6, dtype=BF16)
    expected[:2, :5] = grad.gather(1, index)
    assert torch.equal(self.grad, grad) and torch.equal(src.grad, expected)


def test_opcheck():
    g = generator(12)
    self, source = random_values((4, 3), F32, g), random_values((5, 3), F32, g)
    index = torch.tensor([0, 3, 3, 1, 0])
    torch.library.opcheck(torch.ops.carbon.index_add.default, (self, 0, index, source))
    torch.library.opcheck(torch.ops.carbon.scatter_add.default, (self, 0, torch.tensor([[0, 3, 1]]), source))


def test_torch_compile_fullgraph():
    g = generator(13)
    self, source = random_values((4, 3), F32, g), random_values((5, 3), F32, g)
    index = torch.tensor([0, 3, 3, 1, 0])

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(a, i, b):
        return carbon.index_add(a, 0, i, b) * 1

    assert torch.equal(as_bits(f(self, index, source)), as_bits(carbon.index_add(self, 0, index, source)))


@pytest.mark.cpu_kernels
def test_errors():
    x, s, i = torch.zeros(3, 2), torch.ones(2, 2), torch.tensor([0, 1])
    with pytest.raises(TypeError, match="carbon.index_add:"):
        carbon.index_add(x, 0, i.float(), s)
    with pytest.raises(TypeError, match="carbon.index_add:"):
        carbon.index_add(x.double(), 0, i, s.double())
    with pytest.raises(TypeError, match="carbon.index_add:"):
        carbon.index_add(x, 0, i, s.half())
    with pytest.raises(IndexError, match="carbon.index_add:"):
        carbon.index_add(x, 0, torch.tensor([0, 3]), s)
    with pytest.raises(IndexError, match="carbon.index_add:"):
        carbon.index_add(x, 0, torch.tensor([-1, 0]), s)
    with pytest.raises(ValueError, match="carbon.index_add:"):
        carbon.index_add(x, 0, i, torch.ones(2, 3))
    with pytest.raises(ValueError, match="carbon.index_add:"):
        carbon.index_add(x, 0, torch.tensor([0, 1, 2]), s)
    with pytest.raises(ValueError, match="carbon.index_add:"):
        carbon.index_add(x, 2, i, s)
    with pytest.raises(ValueError, match="carbon.index_add:"):
        carbon.index_add(x, 0, i.reshape(2, 1), s)
    with pytest.raises(ValueError, match="carbon.index_add:"):
        carbon.index_add(x, 0, i.to("meta"), s)  # tensors on two devices
    with pytest.raises(IndexError, match="carbon.scatter_add:"):
        carbon.scatter_add(x, 0, torch.tensor([[3]]), s)
    with pytest.raises(ValueError, match="carbon.scatter_add:"):
        carbon.scatter_add(x, 1, torch.zeros(4, 1, dtype=torch.long), s)
    with pytest.raises(TypeError, match="carbon.scatter_add:"):
        carbon.scatter_add(x, 0, torch.zeros(1, 1, dtype=torch.int16), s)


@pytest.mark.cpu_kernels
def test_portable_tier_one_against_the_oracle():
    # The CPU kernel's tier 1 has an AVX-512 form and a portable one, which CARBON_SCATTER_PORTABLE=1
    # selects (read once per process): the oracle tests above and test_embedding.py, again in a fresh
    # process with the portable form. On a CPU without AVX-512 both runs take the portable form.
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, CARBON_SCATTER_PORTABLE="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k",
                          "not portable and not compile and not opcheck", os.path.join(here, "test_scatter.py"),
                          os.path.join(here, "test_embedding.py")], cwd=os.path.dirname(here), env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
