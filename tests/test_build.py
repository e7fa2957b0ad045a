"""The build itself: CUDA kernels are compiled whenever torch is a CUDA build
and nvcc exists, even without a GPU (so CI compiles every .cu file)."""

import os
import shutil

import pytest
import torch

import carbon

OPS = ["mm", "addmm", "bmm", "baddbmm", "sum", "mean", "round_to"]


def _nvcc_available() -> bool:
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    return shutil.which("nvcc") is not None or os.path.exists(os.path.join(cuda_home, "bin", "nvcc"))


@pytest.mark.parametrize("op", OPS)
def test_cpu_kernels_registered(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"carbon::{op}", "CPU")


@pytest.mark.parametrize("op", OPS)
def test_cuda_kernels_compiled_when_toolchain_present(op):
    if torch.version.cuda is None or not _nvcc_available():
        pytest.skip("CPU-only torch or no nvcc: CUDA kernels are not built here")
    if os.environ.get("CARBON_BUILD_CUDA") == "0":
        pytest.skip("CARBON_BUILD_CUDA=0")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"carbon::{op}", "CUDA")


def test_package_exports():
    for name in ["mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "sum", "mean", "round_to"]:
        assert callable(getattr(carbon, name))
    assert issubclass(carbon.nn.Linear, torch.nn.Linear)
