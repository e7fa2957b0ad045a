"""The build itself: CUDA kernels are compiled whenever torch is a CUDA build
and nvcc exists, even without a GPU (so CI compiles every .cu file)."""

import glob
import os
import shutil

import pytest
import torch

import carbon

# Every op in the carbon namespace (schemas live in csrc/registration.cpp),
# and a list of ops that must be among them.
OPS = sorted(
    name.split("::", 1)[1].split(".", 1)[0]
    for name in torch._C._dispatch_get_all_op_names()
    if name.startswith("carbon::")
)
EXPECTED = [
    "mm", "addmm", "bmm", "baddbmm", "sum", "mean", "round_to", "exp", "log", "tanh", "sigmoid", "erf", "gelu",
    "silu", "elementwise_backward", "layer_norm", "rms_norm", "softmax", "log_softmax", "cross_entropy",
    "attention_logits", "index_add", "scatter_add", "embedding_backward", "uniform", "normal", "dropout",
    "adam_step_", "sgd_step_", "sum_squares", "clip_scale_",
]
# Ops without tensor inputs are device-generic (they pick the device from an argument).
GENERIC = "CompositeExplicitAutograd"


def _has_kernel(op: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"carbon::{op}", key) or (
        torch._C._dispatch_has_kernel_for_dispatch_key(f"carbon::{op}", GENERIC)
    )


def test_expected_ops_registered():
    missing = [op for op in EXPECTED if op not in OPS]
    assert not missing, f"ops missing from the carbon namespace: {missing}"


def _nvcc_available() -> bool:
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    return shutil.which("nvcc") is not None or os.path.exists(os.path.join(cuda_home, "bin", "nvcc"))


@pytest.mark.parametrize("op", OPS)
def test_cpu_kernels_registered(op):
    assert _has_kernel(op, "CPU")


@pytest.mark.parametrize("op", OPS)
def test_cuda_kernels_compiled_when_toolchain_present(op):
    if torch.version.cuda is None or not _nvcc_available():
        pytest.skip("CPU-only torch or no nvcc: CUDA kernels are not built here")
    if os.environ.get("CARBON_BUILD_CUDA") == "0":
        pytest.skip("CARBON_BUILD_CUDA=0")
    assert _has_kernel(op, "CUDA")


def test_package_exports():
    for name in ["mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "sum", "mean", "round_to"]:
        assert callable(getattr(carbon, name))
    assert issubclass(carbon.nn.Linear, torch.nn.Linear)


# Headers that cost a compiler tens of seconds per file (measured on 2 cores: ATen/ATen.h, which declares every
# operator, ~45 s per .cu file and per target architecture in nvcc, 13.5 s per .cpp in gcc; ATen/core/Tensor.h
# ~15 s and 3.5 s). Before they were trimmed they were most of the CUDA build's 25 minutes on CI. Sources include
# at::Tensor, per-operator headers (ATen/ops/empty.h) and c10's stream and guard instead; the .cu files get device
# properties from csrc/cuda_launch.cpp, compiled once by gcc (ATen/cuda/CUDAContext.h brings cuBLAS, cuSPARSE and
# cuSOLVER headers).
HEAVY_FOR_GCC = {"ATen/ATen.h", "ATen/Functions.h", "torch/extension.h", "torch/all.h", "torch/torch.h"}
HEAVY_FOR_NVCC = HEAVY_FOR_GCC | {"ATen/cuda/CUDAContext.h", "ATen/cuda/CUDAContextLight.h",
                                  "ATen/cuda/CUDAGraphsUtils.cuh"}
CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")


def _includes(path: str) -> tuple[list[str], list[str]]:
    """(project headers as paths, system headers as written) included by a file."""
    local, system = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith('#include "'):
                local.append(os.path.normpath(os.path.join(os.path.dirname(path), line.split('"')[1])))
            elif line.startswith("#include <"):
                system.append(line.split("<", 1)[1].split(">", 1)[0])
    return local, system


def _heavy_includes_of(source: str, heavy_set: set[str]) -> list[str]:
    """Every header of heavy_set that `source` includes, directly or through project headers."""
    seen, stack, heavy = set(), [source], []
    while stack:
        path = stack.pop()
        if path in seen:
            continue
        seen.add(path)
        local, system = _includes(path)
        stack += [p for p in local if os.path.exists(p)]
        heavy += [f"{os.path.basename(path)} includes <{h}>" for h in system if h in heavy_set]
    return heavy


def _sources(ext: str) -> list[str]:
    return sorted(os.path.relpath(p, CSRC) for p in glob.glob(os.path.join(CSRC, "**", "*" + ext), recursive=True))


def test_include_scan_follows_project_headers(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inner.h").write_text("#pragma once\n#include <ATen/ATen.h>\n")
    (tmp_path / "outer.h").write_text('#include "sub/inner.h"\n#include <ATen/core/Tensor.h>\n')
    (tmp_path / "kernel.cu").write_text('#include "outer.h"\n#include "missing.h"\n')
    assert _heavy_includes_of(str(tmp_path / "kernel.cu"), HEAVY_FOR_NVCC) == ["inner.h includes <ATen/ATen.h>"]
    (tmp_path / "sub" / "inner.h").write_text("#pragma once\n#include <ATen/ops/empty.h>\n")
    assert _heavy_includes_of(str(tmp_path / "kernel.cu"), HEAVY_FOR_NVCC) == []


@pytest.mark.parametrize("source", _sources(".cu"))
def test_cuda_sources_stay_off_heavy_torch_headers(source):
    heavy = _heavy_includes_of(os.path.join(CSRC, source), HEAVY_FOR_NVCC)
    assert not heavy, f"{source} makes nvcc parse heavy torch headers (slow CUDA builds): {heavy}"


@pytest.mark.parametrize("source", _sources(".cpp"))
def test_cpp_sources_stay_off_heavy_torch_headers(source):
    heavy = _heavy_includes_of(os.path.join(CSRC, source), HEAVY_FOR_GCC)
    assert not heavy, f"{source} makes gcc parse heavy torch headers (slow builds): {heavy}"
