"""Bad inputs raise the documented exception, with a message naming the op:
unsupported dtypes -> TypeError; bad ranks, shapes, batches, biases -> ValueError.
Empty problems are not errors: an empty output, or zeros when K = 0."""

import pytest
import torch

import carbon
from oracle import as_bits

F32, BF16, F16, F64 = torch.float32, torch.bfloat16, torch.float16, torch.float64


def z(*shape, dtype=F32, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


# (exception, op name, callable taking a device)
BAD_CALLS = {
    "mm a 1-D": (ValueError, "mm", lambda d: carbon.mm(z(3, device=d), z(3, 2, device=d))),
    "mm a 3-D": (ValueError, "mm", lambda d: carbon.mm(z(2, 3, 4, device=d), z(4, 2, device=d))),
    "mm b 1-D": (ValueError, "mm", lambda d: carbon.mm(z(2, 3, device=d), z(3, device=d))),
    "mm inner dims": (ValueError, "mm", lambda d: carbon.mm(z(2, 3, device=d), z(4, 2, device=d))),
    "mm float64 a": (TypeError, "mm", lambda d: carbon.mm(z(2, 3, dtype=F64, device=d), z(3, 2, device=d))),
    "mm int32 b": (TypeError, "mm", lambda d: carbon.mm(z(2, 3, device=d), z(3, 2, dtype=torch.int32, device=d))),
    "mm complex a": (TypeError, "mm", lambda d: carbon.mm(z(2, 3, dtype=torch.complex64, device=d), z(3, 2, device=d))),
    "mm out float64": (TypeError, "mm", lambda d: carbon.mm(z(2, 3, device=d), z(3, 2, device=d), out_dtype=F64)),
    "mm out int32": (TypeError, "mm", lambda d: carbon.mm(z(2, 3, device=d), z(3, 2, device=d), out_dtype=torch.int32)),
    "addmm bias (3,) vs (2,2)": (ValueError, "addmm", lambda d: carbon.addmm(z(3, device=d), z(2, 3, device=d), z(3, 2, device=d))),
    "addmm bias 3-D": (ValueError, "addmm", lambda d: carbon.addmm(z(1, 2, 2, device=d), z(2, 3, device=d), z(3, 2, device=d))),
    "addmm bias float64": (TypeError, "addmm", lambda d: carbon.addmm(z(2, dtype=F64, device=d), z(2, 3, device=d), z(3, 2, device=d))),
    "addmm inner dims": (ValueError, "addmm", lambda d: carbon.addmm(z(2, device=d), z(2, 3, device=d), z(2, 2, device=d))),
    "bmm 2-D": (ValueError, "bmm", lambda d: carbon.bmm(z(3, 4, device=d), z(4, 2, device=d))),
    "bmm batch": (ValueError, "bmm", lambda d: carbon.bmm(z(2, 3, 4, device=d), z(3, 4, 2, device=d))),
    "bmm inner dims": (ValueError, "bmm", lambda d: carbon.bmm(z(2, 3, 4, device=d), z(2, 5, 2, device=d))),
    "bmm float64": (TypeError, "bmm", lambda d: carbon.bmm(z(2, 3, 4, dtype=F64, device=d), z(2, 4, 2, device=d))),
    "baddbmm bias batch": (ValueError, "baddbmm", lambda d: carbon.baddbmm(z(4, 1, 1, device=d), z(2, 2, 3, device=d), z(2, 3, 2, device=d))),
    "baddbmm batch": (ValueError, "baddbmm", lambda d: carbon.baddbmm(z(1, device=d), z(2, 2, 3, device=d), z(3, 3, 2, device=d))),
    "baddbmm bias int": (TypeError, "baddbmm", lambda d: carbon.baddbmm(z(1, dtype=torch.int64, device=d), z(2, 2, 3, device=d), z(2, 3, 2, device=d))),
    "linear in_features": (ValueError, "linear", lambda d: carbon.linear(z(2, 3, device=d), z(4, 5, device=d))),
    "linear weight 1-D": (ValueError, "linear", lambda d: carbon.linear(z(2, 3, device=d), z(3, device=d))),
    "linear bias shape": (ValueError, "", lambda d: carbon.linear(z(2, 3, device=d), z(4, 3, device=d), z(5, device=d))),
    "linear float64": (TypeError, "", lambda d: carbon.linear(z(2, 3, dtype=F64, device=d), z(4, 3, dtype=F64, device=d))),
    "matmul batch shapes": (ValueError, "matmul", lambda d: carbon.matmul(z(2, 2, 3, device=d), z(3, 3, 2, device=d))),
    "matmul 0-D": (ValueError, "matmul", lambda d: carbon.matmul(z(device=d), z(3, device=d))),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_input_raises(name):
    exc, op, call = BAD_CALLS[name]
    with pytest.raises(exc, match=rf"^carbon\.{op}" if op else r"^carbon\."):
        call("cpu")


def test_bad_input_raises_the_same_on_meta_tensors():
    """The fake (meta) implementations reject what the real kernels reject,
    with the same exception type and op name, so tracing (torch.compile,
    FakeTensor, the meta device) fails like eager does. One test, listing
    every case that behaves differently."""
    wrong = []
    for name, (exc, op, call) in BAD_CALLS.items():
        if op not in ("mm", "addmm", "bmm", "baddbmm"):
            continue
        try:
            out = call("meta")
        except Exception as e:  # noqa: BLE001 -- the type is what is checked
            if not (isinstance(e, exc) and str(e).startswith(f"carbon.{op}")):
                wrong.append(f"{name}: raised {type(e).__name__}({str(e)[:80]!r}), expected {exc.__name__} 'carbon.{op}...'")
        else:
            wrong.append(f"{name}: returned a {out.dtype} tensor of shape {tuple(out.shape)}, expected {exc.__name__}")
    assert not wrong, "on meta tensors:\n  " + "\n  ".join(wrong)


@pytest.mark.parametrize("M,K,N", [(0, 3, 2), (3, 3, 0), (0, 0, 0), (0, 5, 0)])
@pytest.mark.parametrize("dtype,out_dtype", [(F32, None), (BF16, F32), (F16, BF16)])
def test_empty_outputs(M, K, N, dtype, out_dtype):
    out = carbon.mm(z(M, K, dtype=dtype), z(K, N, dtype=dtype), out_dtype=out_dtype)
    assert out.shape == (M, N) and out.dtype == (out_dtype or dtype)
    out = carbon.addmm(z(N, dtype=dtype), z(M, K, dtype=dtype), z(K, N, dtype=dtype), out_dtype=out_dtype)
    assert out.shape == (M, N) and out.dtype == (out_dtype or dtype)
    out = carbon.bmm(z(2, M, K, dtype=dtype), z(2, K, N, dtype=dtype), out_dtype=out_dtype)
    assert out.shape == (2, M, N) and out.dtype == (out_dtype or dtype)
    assert carbon.bmm(z(0, M, K, dtype=dtype), z(0, K, N, dtype=dtype)).shape == (0, M, N)


@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype", [(F32, F32, None), (BF16, F16, None), (BF16, BF16, F32), (F32, F16, F16)])
def test_k_zero_gives_positive_zeros(a_dtype, b_dtype, out_dtype):
    a = torch.empty(3, 0, dtype=a_dtype)
    b = torch.empty(0, 4, dtype=b_dtype)
    out = carbon.mm(a, b, out_dtype=out_dtype)
    assert out.shape == (3, 4) and out.dtype == (out_dtype or torch.promote_types(a_dtype, b_dtype))
    assert bool((as_bits(out) == 0).all()), "K = 0 must give +0 everywhere"
    out = carbon.bmm(a[None].expand(2, 3, 0), b[None].expand(2, 0, 4), out_dtype=out_dtype)
    assert out.shape == (2, 3, 4) and bool((as_bits(out) == 0).all())


def test_k_zero_with_bias_is_the_rounded_bias():
    bias = torch.tensor([[-0.0, 0.0, 1.0 + 2.0**-24, -3.0]])  # float32 values
    out = carbon.addmm(bias, torch.empty(1, 0), torch.empty(0, 4), out_dtype=BF16)
    # -0, +0, RN_bf16(1 + 2^-24) = 1, -3 (bf16 bits by hand)
    assert as_bits(out).tolist() == [[-0x8000, 0x0000, 0x3F80, -0x3FC0]]  # 0x8000 and 0xC040 as int16


@pytest.mark.parametrize("op,args,shape,dtype", [
    ("mm", ((3, 4), (4, 5)), (3, 5), F32),
    ("addmm", ((5,), (3, 4), (4, 5)), (3, 5), F32),
    ("bmm", ((2, 3, 4), (2, 4, 5)), (2, 3, 5), F32),
    ("baddbmm", ((3, 1), (2, 3, 4), (2, 4, 5)), (2, 3, 5), F32),
])
@pytest.mark.parametrize("in_dtype,out_dtype", [(F32, None), (BF16, F32), (F16, BF16), (BF16, None)])
def test_meta_tensors_give_the_output_shape_and_dtype(op, args, shape, dtype, in_dtype, out_dtype):
    tensors = [torch.empty(s, dtype=in_dtype, device="meta") for s in args]
    out = getattr(carbon, op)(*tensors, out_dtype=out_dtype)
    assert out.device.type == "meta"
    assert out.shape == shape and out.dtype == (out_dtype or in_dtype)
    raw = getattr(torch.ops.carbon, op)(*tensors, out_dtype)
    assert raw.shape == shape and raw.dtype == (out_dtype or in_dtype)


def test_meta_dtype_promotion():
    a = torch.empty(2, 3, dtype=BF16, device="meta")
    b = torch.empty(3, 4, dtype=F16, device="meta")
    assert carbon.mm(a, b).dtype == torch.promote_types(BF16, F16) == F32
