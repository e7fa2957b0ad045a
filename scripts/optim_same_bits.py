"""Same-bits check of carbon's Adam / AdamW step between two builds: hashes
the outputs (p, exp_avg, exp_avg_sq, max_exp_avg_sq bits) of many cases,
to be run under each build and compared.

    python scripts/optim_same_bits.py OUT.json THREADS [CASES]   # one build
    python scripts/optim_same_bits.py --compare A.json B.json     # 0 differ?

Cases: direct adam_step_ calls (float32 / bfloat16 / float16 parameters; 1-4
tensors with tails, up to 70001 elements; values over wide exponent ranges
or all 16-bit patterns, NaN payloads, +-inf, +-0, subnormals; lr from
2^-149 to 3e38; betas 0 with eps 0 and lr a power of two, which puts p - lr
on ties of the format; bias corrections from real steps (c2s == 1 among
them), negative, tiny, huge, 0, inf; AdamW / Adam L2 / maximize /
AMSGrad), then 36 runs of carbon.optim.Adam / AdamW for 3 steps (a few
under flush-to-zero, the generic path). Prints the counts of NaN, inf, zero
and subnormal parameter results of the direct calls (one build), so that a
run shows what it covered.
"""
import hashlib
import json
import math
import random
import sys

import torch

if sys.argv[1] == "--compare":
    a, b = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
    ha, hb = a["hashes"], b["hashes"]
    assert ha.keys() == hb.keys(), "different case lists"
    diff = [k for k in ha if ha[k] != hb[k]]
    print(f"{len(ha)} cases, {a['elements']} elements: {len(diff)} differ {diff[:10]}")
    raise SystemExit(1 if diff else 0)

import carbon  # noqa: E402

out_path = sys.argv[1]
threads = int(sys.argv[2])
n_cases = int(sys.argv[3]) if len(sys.argv) > 3 else 400
torch.set_num_threads(threads)

def rand_f32_bits(rng, n, lo_exp, hi_exp, special_p):
    """float32 bit patterns (as int64): random sign, exponent field in
    [lo_exp, hi_exp], fraction; a share special_p of special values."""
    g = torch.Generator().manual_seed(rng.randrange(1 << 62))
    sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.int64) << 31
    exp = torch.randint(lo_exp, hi_exp + 1, (n,), generator=g, dtype=torch.int64)
    mant = torch.randint(0, 1 << 23, (n,), generator=g, dtype=torch.int64)
    bits = sign | (exp.clamp(0, 255) << 23) | mant
    if special_p > 0:
        sel = torch.rand(n, generator=g) < special_p
        specials = torch.tensor([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA12345, 0xFFFFFFFF, 0x7F800000, 0xFF800000,
                                 0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x00400000, 0x80012345, 0x7F7FFFFF,
                                 0x00800000], dtype=torch.int64)
        idx = torch.randint(0, len(specials), (n,), generator=g)
        bits = torch.where(sel, specials[idx], bits)
    return bits & 0xFFFFFFFF

def f32_from_bits(bits64):
    b = bits64.clone()
    b = torch.where(b >= (1 << 31), b - (1 << 32), b)
    return b.to(torch.int32).view(torch.float32)

def tensor(rng, n, dtype, kind):
    g = torch.Generator().manual_seed(rng.randrange(1 << 62))
    if kind == "gpt2":
        t = 0.02 * torch.randn(n, generator=g)
    elif kind == "unit":
        t = torch.randn(n, generator=g)
    else:
        if dtype == torch.float32 or kind == "wide32":
            lo, hi = {"wide": (0, 255), "mid": (100, 150), "small": (0, 40), "big": (200, 254)}.get(kind, (0, 255))
            sp = 0.02 if rng.random() < 0.7 else 0.0
            t = f32_from_bits(rand_f32_bits(rng, n, lo, hi, sp))
        else:
            bits = torch.randint(0, 1 << 16, (n,), generator=g, dtype=torch.int32)
            bits = torch.where(bits >= (1 << 15), bits - (1 << 16), bits).to(torch.int16)
            t16 = bits.view(dtype)
            if kind == "mid":  # mostly ordinary values, some specials
                t16 = torch.where(torch.rand(n, generator=g) < 0.05, t16, (0.02 * torch.randn(n, generator=g)).to(dtype))
            return t16.contiguous()
    return t.to(dtype).contiguous()

def state(rng, n, kind, nonneg):
    t = tensor(rng, n, torch.float32, kind)
    return t.abs() if nonneg and rng.random() < 0.8 else t

def h(ts):
    m = hashlib.sha256()
    for t in ts:
        m.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return m.hexdigest()

def pick_lr(rng):
    r = rng.random()
    if r < 0.1: return 2.0 ** -149
    if r < 0.2: return 1e4
    if r < 0.25: return 3e38
    if r < 0.3: return 2.0 ** rng.randint(-40, 10)
    return 10 ** rng.uniform(-8, 1)

results = {}
stats = {str(d): dict(values=0, nan=0, inf=0, zero=0, subnormal=0) for d in (torch.float32, torch.bfloat16, torch.float16)}
elements = 0
rng = random.Random(12345)
for case in range(n_cases):
    dtype = [torch.float32, torch.bfloat16, torch.float16][case % 3]
    k = rng.randint(1, 4)
    sizes = [rng.choice([1, 3, 7, 8, 9, 15, 16, 17, 23, 24, 25, 100, 1000, 16383, 16384, 16385, 33000, 70001])
             for _ in range(k)]
    kind = rng.choice(["gpt2", "unit", "wide", "mid", "small", "big"])
    skind = rng.choice(["gpt2", "unit", "wide", "mid", "small"])
    ties = rng.random() < 0.15
    amsgrad = rng.random() < 0.4
    ps = [tensor(rng, n, dtype, kind) for n in sizes]
    gs = [tensor(rng, n, dtype, rng.choice([kind, "gpt2", "wide"])) for n in sizes]
    ms = [state(rng, n, skind, False) for n in sizes]
    vs = [state(rng, n, skind, True) for n in sizes]
    ws = [state(rng, n, skind, True) for n in sizes] if amsgrad else []
    if ties:
        beta1 = beta2 = 0.0
        eps = 0.0
        lr = 2.0 ** rng.randint(-30, 0)
        bc1, bc2s = 1.0, 1.0
        wd = 0.0
    else:
        beta1 = rng.choice([0.9, 0.0, 0.5, 0.99, rng.random()])
        beta2 = rng.choice([0.999, 0.0, 0.95, 0.5, rng.random()])
        eps = rng.choice([1e-8, 0.0, 1e-30, 1.0, 1e-6])
        lr = pick_lr(rng)
        t = rng.choice([1, 2, 10, 1000, 100000, rng.randint(1, 50000)])
        bc1 = 1.0 - carbon.optim.power(beta1, t)
        bc2s = math.sqrt(1.0 - carbon.optim.power(beta2, t))
        r = rng.random()
        if r < 0.05: bc2s = -bc2s if bc2s else -0.5
        elif r < 0.1: bc2s = rng.choice([1e-300, 1e300, 2.0 ** -1060, 3.0, 1.0, 0.0, float("inf")])
        if bc1 == 0.0: bc1 = 1.0
        wd = rng.choice([0.0, 0.1, -0.0, 1e3, 0.01])
    decoupled = rng.random() < 0.5
    maximize = rng.random() < 0.2
    torch.ops.carbon.adam_step_(ps, gs, ms, vs, ws, lr, beta1, beta2, eps, wd, bc1, bc2s, decoupled, maximize)
    results[f"direct{case}"] = h(ps + ms + vs + ws)
    for p in ps:
        f = p.float()
        stats[str(dtype)]["nan"] += int(f.isnan().sum())
        stats[str(dtype)]["inf"] += int(f.isinf().sum())
        stats[str(dtype)]["zero"] += int((f == 0).sum())
        tiny = torch.finfo(dtype).tiny
        stats[str(dtype)]["subnormal"] += int(((f != 0) & (f.abs() < tiny)).sum())
        stats[str(dtype)]["values"] += f.numel()
    elements += sum(sizes)

# optimizer runs, 3 steps each
for case in range(36):
    dtype = [torch.float32, torch.bfloat16, torch.float16][case % 3]
    sizes = [rng.choice([1, 5, 8, 13, 100, 1023, 4099, 16385, 40000]) for _ in range(rng.randint(1, 5))]
    kind = rng.choice(["gpt2", "unit", "wide"])
    params = [torch.nn.Parameter(tensor(rng, n, dtype, kind)) for n in sizes]
    cls = rng.choice([carbon.optim.AdamW, carbon.optim.Adam])
    kw = dict(lr=rng.choice([1e-4, 1e-3, 1.0]), weight_decay=rng.choice([0.0, 0.1]), amsgrad=rng.random() < 0.4,
              maximize=rng.random() < 0.2)
    opt = cls(params, **kw)
    torch.set_flush_denormal(case % 9 == 4)  # a few runs under flush-to-zero (the block path)
    for step in range(3):
        for p in params:
            p.grad = tensor(rng, p.numel(), dtype, rng.choice(["gpt2", "wide", "unit"]))
        opt.step()
    ts = list(params)
    for p in params:
        ts += [v for k2, v in sorted(opt.state[p].items()) if k2 != "step"]
    results[f"optim{case}"] = h(ts)
    elements += sum(sizes) * 3

torch.set_flush_denormal(False)
json.dump({"elements": elements, "stats": stats, "hashes": results}, open(out_path, "w"))
print(f"{len(results)} cases, {elements} elements, threads {threads}; p outputs: {stats}")
