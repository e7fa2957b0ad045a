"""carbon.fingerprint: checked against a SHA-256 computed here, independently,
from the byte format of docs/fingerprint.md (struct-packed element values, not
the implementation's tensor-to-bytes path)."""

import hashlib
import math
import struct

import pytest
import torch

import carbon
from carbon.fingerprint import Fingerprint

# element formats for struct (little-endian) and the integer dtype whose values carry the bits
_STRUCT = {
    torch.float32: ("i", torch.int32),
    torch.float64: ("q", torch.int64),
    torch.bfloat16: ("h", torch.int16),
    torch.float16: ("h", torch.int16),
    torch.int64: ("q", torch.int64),
    torch.int32: ("i", torch.int32),
    torch.uint8: ("B", torch.uint8),
}


def _record(t: torch.Tensor) -> bytes:
    """docs/fingerprint.md's record, written independently: the element bits
    through .view(int).tolist() and struct.pack, row-major by flattening."""
    code, int_dtype = _STRUCT[t.dtype]
    values = t.detach().cpu().reshape(-1).view(int_dtype).tolist()
    data = struct.pack("<%d%s" % (len(values), code), *values)
    dtype = {torch.float32: b"float32", torch.float64: b"float64", torch.bfloat16: b"bfloat16",
             torch.float16: b"float16", torch.int64: b"int64", torch.int32: b"int32", torch.uint8: b"uint8"}[t.dtype]
    shape = b"".join(struct.pack("<Q", s) for s in t.shape)
    return struct.pack("<I", len(dtype)) + dtype + struct.pack("<I", t.dim()) + shape + struct.pack("<Q", len(data)) + data


def _reference(named: dict) -> tuple:
    h = hashlib.sha256(b"carbon.fingerprint/1\n")
    per = {}
    for name in sorted(named, key=lambda n: n.encode()):
        rec = _record(named[name])
        h.update(struct.pack("<I", len(name.encode())) + name.encode() + rec)
        per[name] = hashlib.sha256(rec).hexdigest()
    return h.hexdigest(), per


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.lin = torch.nn.Linear(5, 3)
        self.emb = torch.nn.Embedding(7, 4)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(3, 5, generator=g))
            self.lin.bias.copy_(torch.randn(3, generator=g))
            self.emb.weight.copy_(torch.randn(7, 4, generator=g))
        self.register_buffer("count", torch.tensor(41, dtype=torch.int64))
        self.register_buffer("low", torch.randn(2, 3, generator=g).to(torch.bfloat16))
        self.register_buffer("mask", torch.tensor([1, 0, 255], dtype=torch.uint8))


def test_matches_independent_sha256():
    model = Small()
    fp = carbon.fingerprint(model)
    expected, per = _reference(dict(model.state_dict()))
    assert fp.hexdigest == expected
    assert fp.tensors == per
    assert list(fp.tensors) == sorted(per)  # hashed in sorted order
    assert str(fp) == expected[:16] and fp.short == expected[:16]
    assert len(fp.hexdigest) == 64


def test_state_dict_mapping_and_scalars():
    named = {"b": torch.tensor(2.5), "a": torch.zeros(0, 3), "c.d": torch.arange(6, dtype=torch.int32).reshape(2, 3)}
    assert carbon.fingerprint(named).hexdigest == _reference(named)[0]


def test_one_ulp_changes_digest_and_names_the_tensor():
    model = Small()
    before = carbon.fingerprint(model)
    with torch.no_grad():
        w = model.lin.weight
        w[1, 2] = torch.nextafter(w[1, 2], torch.tensor(math.inf))
    after = carbon.fingerprint(model)
    assert after != before
    assert after.diff(before) == ["lin.weight"]
    assert after.tensors["lin.bias"] == before.tensors["lin.bias"]


def test_layout_does_not_matter():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) * 0.37
    view = base.t()  # non-contiguous
    assert not view.is_contiguous()
    sliced = torch.zeros(10, 8)[2:6:, 1:7:]  # offset + strides
    sliced.copy_(base)
    a = carbon.fingerprint({"w": view})
    b = carbon.fingerprint({"w": view.contiguous()})
    assert a == b and a.hexdigest == _reference({"w": view.contiguous()})[0]
    assert carbon.fingerprint({"w": sliced}) == carbon.fingerprint({"w": base})
    # same values, different shape: different digest
    assert carbon.fingerprint({"w": base.reshape(6, 4)}) != carbon.fingerprint({"w": base})


def test_bits_not_values():
    pos, neg = torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0])
    assert torch.equal(pos, neg)  # equal as values
    assert carbon.fingerprint({"x": pos}) != carbon.fingerprint({"x": neg})
    nan1 = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    nan2 = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert nan1.isnan().all() and nan2.isnan().all()
    assert carbon.fingerprint({"x": nan1}) != carbon.fingerprint({"x": nan2})
    assert carbon.fingerprint({"x": nan2}).hexdigest == _reference({"x": nan2})[0]


def test_dtype_is_part_of_the_record():
    x = torch.tensor([1.0, 2.0])
    assert carbon.fingerprint({"x": x}) != carbon.fingerprint({"x": x.double()})
    assert carbon.fingerprint({"x": x}) != carbon.fingerprint({"y": x})  # name is part of the overall digest
    assert carbon.fingerprint({"x": x}).tensors["x"] == carbon.fingerprint({"y": x}).tensors["y"]


def test_optimizer_state_included():
    model = Small()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    model.lin(x).square().sum().backward()
    opt.step()
    fp_model = carbon.fingerprint(model)
    fp_both = carbon.fingerprint(model, opt)
    assert fp_both != fp_model
    named = dict(model.state_dict())
    for index, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            named[f"optimizer.state.{index}.{key}"] = value
    expected, per = _reference(named)
    assert fp_both.hexdigest == expected and fp_both.tensors == per
    assert "optimizer.state.0.exp_avg" in fp_both.tensors
    # the same from the optimizer's state_dict
    assert carbon.fingerprint(model.state_dict(), opt.state_dict()) == fp_both
    # a change in a state moment changes the digest
    with torch.no_grad():
        opt.state[model.lin.weight]["exp_avg_sq"][0, 0] *= 2
    assert carbon.fingerprint(model, opt) != fp_both
    assert carbon.fingerprint(model) == fp_model


def test_python_scalar_optimizer_state():
    """Python numbers in an optimizer state are hashed as 0-dim int64 / float64 / bool tensors."""
    state = {"state": {0: {"step": 3, "lr_scale": 0.5, "flag": True, "m": torch.ones(2)}}, "param_groups": []}
    rec = carbon.fingerprint({}, state).tensors
    assert rec["optimizer.state.0.m"] == _reference({"m": torch.ones(2)})[1]["m"]
    assert rec["optimizer.state.0.step"] == _reference({"s": torch.tensor(3)})[1]["s"]
    assert rec["optimizer.state.0.lr_scale"] == _reference({"s": torch.tensor(0.5, dtype=torch.float64)})[1]["s"]
    bool_record = struct.pack("<I", 4) + b"bool" + struct.pack("<I", 0) + struct.pack("<Q", 1) + b"\x01"
    assert rec["optimizer.state.0.flag"] == hashlib.sha256(bool_record).hexdigest()


def test_errors():
    with pytest.raises(TypeError, match="torch.nn.Module or a state_dict"):
        carbon.fingerprint(3)
    with pytest.raises(TypeError, match="not a tensor"):
        carbon.fingerprint({"x": 1.0})
    with pytest.raises(TypeError, match="optimizer"):
        carbon.fingerprint({}, optimizer=[1, 2])
    with pytest.raises(TypeError, match="dense"):
        carbon.fingerprint({"x": torch.eye(3).to_sparse()})
    with pytest.raises(ValueError, match="meta"):
        carbon.fingerprint({"x": torch.empty(2, device="meta")})
    with pytest.raises(ValueError, match="two entries"):
        carbon.fingerprint({"optimizer.state.0.m": torch.ones(1)},
                           {"state": {0: {"m": torch.ones(1)}}, "param_groups": []})


def test_equality_semantics():
    a = carbon.fingerprint({"x": torch.ones(3)})
    b = carbon.fingerprint({"x": torch.ones(3)})
    assert isinstance(a, Fingerprint) and a == b and hash(a) == hash(b) and a.diff(b) == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_same_digest_on_cuda():
    model = Small()
    cpu = carbon.fingerprint(model)
    assert carbon.fingerprint(model.cuda()) == cpu
