"""Same bits across builds for attention and carbon.bmm: saves every output
and gradient of ~3500 cases (shapes across the 64-row GEMM blocks and the
softmax steps, three dtypes, masks, scales, NaN / inf / zeros / subnormals /
wide exponents, dropout) to a file, to be compared with another build's.

    python scripts/attention_bits.py save OUT.pt THREADS     # with one build
    python scripts/attention_bits.py compare A.pt B.pt        # bitwise

Run "save" once with each build (e.g. main's and a branch's), then
"compare"; prints the number of tensors that differ (0 expected).
"""
import math, sys
import torch

import carbon


results = {}

def special(t, gen, kind):
    t = t.clone()
    flat = t.view(-1)
    n = flat.numel()
    if n == 0: return t
    idx = torch.randint(0, n, (max(1, n // 50),), generator=gen)
    if kind == "nan": flat[idx[:3]] = float("nan")
    elif kind == "inf": flat[idx[:2]] = float("inf"); flat[idx[2:4]] = -float("inf")
    elif kind == "zeros": flat[idx] = 0.0; flat[idx[::2]] = -0.0
    elif kind == "subnormal":
        tiny = torch.finfo(t.dtype).tiny
        flat[idx] = flat[idx] * tiny * 1e-3 if t.dtype == torch.float32 else flat[idx] * tiny * 0.01
    elif kind == "huge": flat[idx] = flat[idx] * (torch.finfo(t.dtype).max / 8)
    elif kind == "wide": t.mul_(torch.exp2(torch.randint(-40, 40, t.shape, generator=gen).to(torch.float32)).to(t.dtype))
    elif kind == "zero_rows": t[..., ::3, :] = 0.0
    elif kind == "cancel": t[..., 1::2, :] = -t[..., 0:-1:2, :] if t.shape[-2] > 1 else t
    return t

def bits(t):
    if t is None: return None
    t = t.detach().contiguous()
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype]).clone()

def run_case(name, B, H, L, S, E, dtype, causal, mask_kind, scale, kinds, dropout=0.0, mask_grad=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, E, generator=gen).to(dtype)
    k = torch.randn(B, H, S, E, generator=gen).to(dtype)
    v = torch.randn(B, H, S, E, generator=gen).to(dtype)
    g = torch.randn(B, H, L, E, generator=gen).to(dtype)
    kq, kk, kv, kg = kinds
    q, k, v, g = special(q, gen, kq), special(k, gen, kk), special(v, gen, kv), special(g, gen, kg)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(L, S, generator=gen) > 0.3
        mask[::5] = False  # fully masked rows
    elif mask_kind == "float":
        mask = torch.randn(H, L, S, generator=gen) * 3
        mask[:, ::4, ::3] = -math.inf
    elif mask_kind == "float_bf16":
        mask = (torch.randn(1, L, S, generator=gen)).to(torch.bfloat16)
    qq, kk_, vv = (t.clone().requires_grad_() for t in (q, k, v))
    m = None
    if mask is not None:
        m = mask.clone()
        if mask_grad and m.dtype != torch.bool:
            m.requires_grad_()
    if dropout > 0: carbon.manual_seed(1234)
    out = carbon.scaled_dot_product_attention(qq, kk_, vv, attn_mask=m, is_causal=causal, scale=scale, dropout_p=dropout)
    inputs = [qq, kk_, vv] + ([m] if (m is not None and m.requires_grad) else [])
    grads = torch.autograd.grad(out, inputs, g)
    results[name] = [bits(out)] + [bits(x) for x in grads]
    with torch.no_grad():
        if dropout > 0: carbon.manual_seed(1234)
        results[name + "/nograd"] = [bits(carbon.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, dropout_p=dropout))]

def save(out_path, threads):
    torch.set_num_threads(threads)
    count = 0
    shapes = [(1, 1, 1, 1, 32), (2, 3, 7, 7, 64), (1, 2, 64, 64, 80), (1, 2, 255, 255, 32), (2, 2, 256, 256, 64),
              (1, 2, 257, 257, 128), (1, 1, 300, 300, 64), (1, 2, 1024, 1024, 64), (2, 1, 7, 13, 32), (1, 2, 70, 130, 64),
              (1, 2, 300, 64, 80), (1, 1, 129, 200, 128)]
    dtypes = [torch.float32, torch.bfloat16, torch.float16]
    kind_sets = [("n", "n", "n", "n"), ("nan", "n", "n", "n"), ("n", "inf", "n", "n"), ("n", "n", "inf", "n"), ("n", "n", "n", "inf"),
                 ("zeros", "zeros", "zeros", "zeros"), ("subnormal", "subnormal", "n", "subnormal"), ("huge", "n", "huge", "n"),
                 ("wide", "wide", "wide", "wide"), ("zero_rows", "n", "n", "zero_rows"), ("cancel", "n", "cancel", "n"), ("n", "n", "n", "nan")]
    for si, (B, H, L, S, E) in enumerate(shapes):
        big = L * S * B * H > 300000
        for di, dtype in enumerate(dtypes):
            for causal in (True, False):
                for ki, kinds in enumerate(kind_sets):
                    if big and ki not in (0, 1, 3, 8): continue
                    if big and dtype == torch.float16 and ki != 0: continue
                    scale = [None, 0.5, -0.3, 1e30, 1e-30, 3.0][(si + di + ki) % 6] if not big else None
                    run_case(f"s{si}/{dtype}/c{causal}/k{ki}", B, H, L, S, E, dtype, causal, None, scale, kinds, seed=si * 100 + ki)
                    count += 1
            if not big:
                for mk in ("bool", "float", "float_bf16"):
                    run_case(f"s{si}/{dtype}/m{mk}", B, H, L, S, E, dtype, False, mk, 0.25, ("n", "n", "n", "n"), seed=si + 7)
                    run_case(f"s{si}/{dtype}/m{mk}/grad", B, H, L, S, E, dtype, False, mk, None, ("wide", "n", "n", "n"), mask_grad=True, seed=si + 8)
                    count += 2
                run_case(f"s{si}/{dtype}/drop", B, H, L, S, E, dtype, True, None, None, ("n", "n", "n", "n"), dropout=0.3, seed=si + 9)
                count += 1

    # direct carbon.bmm / mm: triangular and zero-span operands, both dtypes, special values, K beyond the own kernel's limit
    gen = torch.Generator().manual_seed(99)
    for (Bb, M, K, N) in [(3, 200, 70, 130), (2, 256, 256, 64), (1, 300, 1024, 65), (1, 130, 1030, 70), (4, 64, 8, 64), (2, 129, 3, 257), (1, 1, 1, 1)]:
        for dtype in dtypes:
            for kind in ("n", "nan", "inf", "zeros", "subnormal", "wide", "huge", "zero_rows"):
                a = special(torch.randn(Bb, M, K, generator=gen).to(dtype), gen, kind)
                b = special(torch.randn(Bb, K, N, generator=gen).to(dtype), gen, "n" if kind == "huge" else kind)
                tri_a = a * torch.ones(M, K).tril().to(dtype)
                tri_b = b * torch.ones(K, N).triu().to(dtype)
                for od in (torch.float32, torch.bfloat16, torch.float16):
                    results[f"bmm/{Bb}x{M}x{K}x{N}/{dtype}/{kind}/{od}"] = [
                        bits(carbon.bmm(a, b, out_dtype=od)), bits(carbon.bmm(tri_a, b, out_dtype=od)),
                        bits(carbon.bmm(a, tri_b, out_dtype=od)), bits(carbon.bmm(tri_a.transpose(1, 2).contiguous().transpose(1, 2), tri_b, out_dtype=od)),
                        bits(carbon.mm(tri_a[0], b[0], out_dtype=od))]
                    count += 5
    torch.save(results, out_path)
    print("cases", count, "entries", len(results))


def compare(path_a, path_b):
    a = torch.load(path_a); b = torch.load(path_b)
    assert a.keys() == b.keys(), (set(a) ^ set(b))
    bad = 0; tensors = 0; elems = 0
    for k in a:
        for x, y in zip(a[k], b[k]):
            if x is None and y is None: continue
            tensors += 1; elems += x.numel()
            if x.shape != y.shape or not torch.equal(x, y):
                bad += 1
                if bad < 10: print("DIFF", k, x.shape, (x != y).sum().item() if x.shape == y.shape else "shape")
    print(f"{len(a)} entries, {tensors} tensors, {elems} elements, {bad} differ")
    return bad


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(1 if compare(sys.argv[2], sys.argv[3]) else 0)
