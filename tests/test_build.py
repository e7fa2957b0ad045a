"""The build itself: CUDA kernels are compiled whenever torch is a CUDA build
and nvcc exists, even without a GPU (so CI compiles every .cu file)."""

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
