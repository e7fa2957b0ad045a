"""Build Carbon's kernels.

CPU kernels are always built. CUDA kernels are built whenever torch is a CUDA
build and nvcc is found -- also on machines without a GPU, so that CI compiles
every .cu file. Set CARBON_BUILD_CUDA=0 to skip them.

Floating point: no fast-math anywhere, and no contraction of a*b+c into an
FMA in either compiler (-ffp-contract=off, --fmad=false); where a fused
operation is meant, the code says fma explicitly. Subnormals are kept.
"""

import glob
import os
import shutil

from setuptools import find_packages, setup


def _default_cuda_home():
    nvcc = shutil.which("nvcc")
    for candidate in ("/usr/local/cuda", os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None):
        if candidate and os.path.exists(os.path.join(candidate, "bin", "nvcc")):
            return candidate
    return None


# torch.utils.cpp_extension reads CUDA_HOME when it is imported; an nvcc
# wrapper on PATH would otherwise make it guess /usr/local.
if "CUDA_HOME" not in os.environ and _default_cuda_home():
    os.environ["CUDA_HOME"] = _default_cuda_home()

import torch  # noqa: E402
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension  # noqa: E402

# The C++ standard is left to torch (2.14 needs C++20, older releases C++17).
ROOT = os.path.dirname(os.path.abspath(__file__))
# -fopenmp: at::parallel_for is inlined from ATen's OpenMP backend; without
# the flag its pragma is ignored and carbon's CPU loops run on one thread.
# -fno-math-errno: sqrt (and the like) need not set errno for a negative
# argument. It changes no value -- the result is the IEEE square root (NaN
# for x < 0) either way -- but without it gcc guards every inlined sqrtsd
# with a branch to the libm call that sets errno, and a loop with that
# branch does not vectorize. It allows no reassociation, no approximation
# and no vector libm (glibc declares those only under -ffast-math).
CXX_FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math", "-fno-math-errno", "-Wall", "-fopenmp"]
LINK_FLAGS = ["-fopenmp"]
NVCC_FLAGS = [
    "-O3",
    "--fmad=false",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "-Xcompiler=-ffp-contract=off",
]


def _build_cuda() -> bool:
    if os.environ.get("CARBON_BUILD_CUDA", "1") == "0":
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None


def _pip_cuda_include_dirs():
    """Headers of the pip CUDA wheels (cublas_v2.h, cusparse.h, ...), which
    ATen/cuda/CUDAContext.h needs and a bare nvcc install may lack."""
    try:
        import nvidia
    except ImportError:
        return []
    dirs = []
    for base in list(nvidia.__path__):
        dirs += glob.glob(os.path.join(base, "cu[0-9]*", "include"))
    return sorted(d for d in dirs if os.path.isdir(d))


def _set_default_arch_list():
    """Respect TORCH_CUDA_ARCH_LIST; without it and without a visible GPU
    (torch would fail: pytorch/pytorch#137261), build sm_80 and sm_90 plus PTX
    so newer GPUs can JIT the kernels."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return
    if torch.cuda.is_available():
        return
    os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0+PTX"


def _extension():
    sources = sorted(glob.glob("csrc/**/*.cpp", recursive=True))
    include_dirs = [os.path.join(ROOT, "csrc")]
    if _build_cuda():
        _set_default_arch_list()
        sources += sorted(glob.glob("csrc/**/*.cu", recursive=True))
        return CUDAExtension(
            "carbon._C",
            sources,
            include_dirs=include_dirs + _pip_cuda_include_dirs(),
            define_macros=[("CARBON_WITH_CUDA", "1")],
            extra_compile_args={"cxx": CXX_FLAGS, "nvcc": NVCC_FLAGS},
            extra_link_args=LINK_FLAGS,
        )
    return CppExtension(
        "carbon._C", sources, include_dirs=include_dirs, extra_compile_args={"cxx": CXX_FLAGS}, extra_link_args=LINK_FLAGS
    )


setup(
    name="carbon",
    version="0.1.0",
    description="Bit-exact deep learning for PyTorch: correctly rounded kernels that give the same bits everywhere",
    license="Apache-2.0",
    packages=find_packages(include=["carbon", "carbon.*"]),
    package_data={"carbon": ["py.typed"], "carbon.data": ["*.txt"]},
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.10",
    install_requires=["torch>=2.8", "numpy"],
    extras_require={"demo": ["tqdm", "matplotlib"]},  # python -m carbon demo: progress bars and the loss-curve PNG
)
