"""Same bits across builds for carbon.sum / carbon.mean: hashes the outputs of
~180,000 cases (dims 1, 0, all and (0, 1); float32 / bfloat16 / float16
inputs; default, float32 and bfloat16 outputs; shapes around the CPU's
64-row decision blocks, the 32-element tails, the 256-element bfloat16
groups, the 8-row column groups and 64-row column passes, the long-row and
column paths; 15 kinds of data incl. NaN / inf / subnormals, exact ties,
overflow, cancellation and exponent spreads around the bfloat16 groups'
limit, and the float16 groups'). Prints a hash per shape and the total.

    python scripts/sum_bits.py THREADS [START STEP]    # shapes[START::STEP]

Run it with two builds (or thread counts, or CARBON_NORM_SCALAR=1 for the
portable kernels) and compare the printed hashes; they must be equal.
Inputs are generated at one thread (torch's index_put with duplicate
indices picks a different duplicate at two).
"""
import hashlib, sys, torch, carbon
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
def gen(kind, shape, g):
    n = 1
    for s in shape: n *= s
    if kind == "normal": return torch.randn(shape, generator=g)
    if kind == "wide": return torch.randn(shape, generator=g) * torch.pow(2.0, torch.randint(-60, 60, shape, generator=g).float())
    if kind == "cancel":
        x = torch.randn(shape, generator=g) * 1e6
        x = x - x.flip(-1)  # antisymmetric rows sum to ~0
        if n: x.view(-1)[:: max(1, n // 7)] += torch.pow(2.0, torch.randint(-30, 0, (1,), generator=g).float())
        return x
    if kind == "zeros": return torch.zeros(shape)
    if kind == "negzeros": return -torch.zeros(shape)
    if kind == "special":
        x = torch.randn(shape, generator=g)
        flat = x.view(-1)
        if n == 0: return x
        idx = torch.randint(0, n, (max(1, n // 50),), generator=g)
        vals = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e-40, -1e-42, 3e38, -3e38, 0.0, -0.0])
        flat[idx] = vals[torch.randint(0, len(vals), idx.shape, generator=g)]
        return x
    if kind == "ties":  # 1 + 2^-24 and friends: sums at float32 midpoints
        x = torch.zeros(shape)
        flat = x.view(-1)
        if n == 0: return x
        flat[0::3] = 1.0; flat[1::3] = 2.0 ** -24; flat[2::3] = 2.0 ** -60
        return x
    if kind == "huge": return torch.full(shape, 3.0e38) * torch.sign(torch.randn(shape, generator=g))
    if kind == "ints": return torch.randint(-100, 100, shape, generator=g).float()
    if kind == "tiny": return torch.randn(shape, generator=g) * 1e-39
    if kind == "spans": return torch.randn(shape, generator=g) * torch.pow(2.0, torch.randint(-7, 8, shape, generator=g).float())
    if kind == "spans14": return torch.sign(torch.randn(shape, generator=g)) * torch.pow(2.0, torch.randint(0, 15, shape, generator=g).float()) * (1 + torch.randint(0, 128, shape, generator=g).float() / 128)
    if kind == "spans11":  # float16 groups' limit: exponent spans 0..11 around their 10
        return torch.sign(torch.randn(shape, generator=g)) * torch.pow(2.0, torch.randint(0, 12, shape, generator=g).float()) * (1 + torch.randint(0, 1024, shape, generator=g).float() / 1024)
    if kind == "sparse_tiny":
        x = torch.randn(shape, generator=g)
        if n: x.view(-1)[:: 97] *= 2.0 ** -14
        return x
    if kind == "nearmax": return torch.sign(torch.randn(shape, generator=g)) * (3.3e38 - torch.rand(shape, generator=g) * 1e38)
    if kind == "subnormal16": return torch.randn(shape, generator=g) * 2.0 ** -130
    raise ValueError(kind)
kinds = ["normal", "wide", "cancel", "zeros", "negzeros", "special", "ties", "huge", "ints", "tiny", "spans", "spans14", "spans11", "sparse_tiny", "nearmax", "subnormal16"]
shapes = [(r, n) for r in (1, 2, 3, 63, 64, 65, 130) for n in (0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 100, 767, 768, 769, 1000)]
shapes += [(1, 40000), (2, 70001), (3, 4096), (1, 8193), (5, 33000), (2000, 33), (1100, 300), (4096, 96)]
shapes += [(8, 32), (9, 33), (16, 256), (72, 257), (1024, 64), (1025, 31), (1031, 300), (2055, 40), (64, 768), (3, 256), (2, 257), (1, 255), (1, 256), (1, 511), (1, 512), (1, 513), (5, 2065), (7, 3000), (17, 1), (4100, 3)]
if len(sys.argv) > 2: shapes = shapes[int(sys.argv[2])::int(sys.argv[3])]
g = torch.Generator().manual_seed(1)
h = hashlib.sha256(); count = 0
for shape in shapes:
    for kind in kinds:
        nt = torch.get_num_threads(); torch.set_num_threads(1)  # index_put with duplicates: 1 thread
        base = gen(kind, shape, g)
        torch.set_num_threads(nt)
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            x = base.to(dt)
            for op in (carbon.sum, carbon.mean):
                for dim in (1, 0, None, (0, 1)):
                    for out_dt in (None, torch.float32, torch.bfloat16):
                        try:
                            y = op(x, dim, dtype=out_dt) if dim is not None else op(x, dtype=out_dt)
                            b = y.contiguous().view(torch.uint8).numpy().tobytes() if y.numel() else b""
                        except Exception as e:
                            b = repr(e).encode()
                        h.update(b); count += 1
    print(shape, h.hexdigest()[:16], flush=True)
print("cases", count, h.hexdigest())
