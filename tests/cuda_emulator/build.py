"""Build Carbon's CUDA code for the CPU emulator (cuda_emulator.h) and load it as the op library `carbon_emu`.

The build is a rewritten copy of csrc/ (nothing in csrc/ changes):
- every .cu file is compiled as C++ with the emulator's header first; a launch `k<<<grid, block, shared,
  stream>>>(args);` becomes `cuda_emu::launch(cuda_emu::LaunchConfig(grid, block, shared, stream), [&] { k(args); });`
  and `extern __shared__ T name[];` a pointer to the emulated block's dynamic shared memory;
- .cuh headers (kernels included by several .cu files) get the same rewriting;
- the op files take their CUDA branch for every tensor: `t.is_cpu()` reads false (except in argument checks), so a
  CPU tensor travels the path a CUDA tensor would, into the emulated kernels;
- the library is `carbon_emu` (namespace and op library renamed), so it loads beside carbon's own `carbon`.

torch.ops.carbon_emu.<op>(cpu tensors) therefore returns what carbon's CUDA kernels would compute on a GPU.
Usage: `from cuda_emulator.build import load; ops = load()` (compiles on first use, ~2-5 minutes on 2 cores).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CSRC = os.path.join(ROOT, "csrc")
NAME = "carbon_cuda_emulated"
LIBRARY = "carbon_emu"

# The flags of setup.py's C++ build (floating point exactly as there), plus the emulation's.
CXX_FLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math", "-fno-math-errno", "-fopenmp",
             "-DCARBON_WITH_CUDA=1", f"-Dcarbon={LIBRARY}", "-Wno-unknown-pragmas"]


def _matching(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index just past the bracket that closes text[start] (== open_ch)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced {open_ch}{close_ch} from offset {start}")


def _kernel_start(text: str, end: int) -> int:
    """Start of the kernel expression ending at text[end] (`name` or `name<args>`, possibly qualified)."""
    i = end
    if text[i - 1] == ">":  # template arguments: walk back to the matching '<'
        depth = 0
        while True:
            i -= 1
            if text[i] == ">":
                depth += 1
            elif text[i] == "<":
                depth -= 1
                if depth == 0:
                    break
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_:"):
        i -= 1
    return i


def rewrite_launches(text: str) -> str:
    """k<<<cfg>>>(args) -> ::cuda_emu::launch(::cuda_emu::LaunchConfig(cfg), [&] { k(args); })"""
    out = []
    pos = 0
    while True:
        open_at = text.find("<<<", pos)
        if open_at < 0:
            out.append(text[pos:])
            return "".join(out)
        close_at = text.index(">>>", open_at)
        config = text[open_at + 3:close_at]
        args_at = close_at + 3
        while text[args_at].isspace():
            args_at += 1
        if text[args_at] != "(":
            raise ValueError(f"a launch without arguments at offset {open_at}")
        args_end = _matching(text, args_at, "(", ")")
        start = _kernel_start(text, open_at)
        kernel = text[start:open_at]
        out.append(text[pos:start])
        out.append(f"::cuda_emu::launch(::cuda_emu::LaunchConfig({config}), [&] {{ {kernel}{text[args_at:args_end]}; }})")
        pos = args_end


_STATIC_SHARED = re.compile(r"^(\s*__shared__\s+[\w:<>]+(?:\s+[\w:<>]+)*?\s+)(\w+(?:\s*\[[^\]]*\])?(?:\s*,\s*\w+(?:\s*\[[^\]]*\])?)*)\s*;",
                            re.MULTILINE)
_EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+([\w:<>\s]+?)\s+(\w+)\s*\[\s*\]\s*;")
_IS_CPU = re.compile(r"\b([A-Za-z_][\w.]*(?:\[\w+\])?(?:\.[A-Za-z_]\w*)*)\.is_cpu\(\)")


def _track_static_shared(match: re.Match) -> str:
    """`__shared__ T a[n], b;` -> the same, then each variable registered with the emulator (same line)."""
    names = re.findall(r"(\w+)(?:\s*\[[^\]]*\])?\s*(?:,|$)", match.group(2))
    tracks = " ".join(f"::cuda_emu::track_shared(&{n}, sizeof {n});" for n in names)
    return f"{match.group(0)} {tracks}"


def rewrite_cu(text: str) -> str:
    text = rewrite_launches(text)
    text = _STATIC_SHARED.sub(_track_static_shared, text)
    text = _EXTERN_SHARED.sub(r"\1* \2 = reinterpret_cast<\1*>(::cuda_emu::dynamic_shared_memory());", text)
    return '#include "cuda_emulator.h"\n' + text


def rewrite_cpp(text: str) -> str:
    lines = []
    for line in text.splitlines(keepends=True):
        if "TORCH_CHECK" not in line:  # argument checks keep accepting CPU tensors
            line = _IS_CPU.sub(r"::cuda_emu_on_cpu(\1)", line)
        lines.append(line)
    text = "".join(lines)
    text = text.replace("TORCH_LIBRARY(carbon,", f"TORCH_LIBRARY({LIBRARY},")
    text = text.replace("TORCH_LIBRARY_IMPL(carbon,", f"TORCH_LIBRARY_IMPL({LIBRARY},")
    return '#include "on_device.h"\n' + text


def _write_if_changed(path: str, text: str) -> None:
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def build_directory() -> str:
    base = os.environ.get("CARBON_CUDA_EMULATOR_BUILD", os.path.join(ROOT, "build", "cuda_emulator"))
    return os.path.abspath(base)


def prepare_sources(out_dir: str) -> list[str]:
    """Writes the rewritten copy of csrc/ under out_dir; returns the files to compile."""
    sources = []
    copy_root = os.path.join(out_dir, "csrc")
    for path in sorted(glob.glob(os.path.join(CSRC, "**", "*"), recursive=True)):
        if os.path.isdir(path):
            continue
        rel = os.path.relpath(path, CSRC)
        with open(path) as f:
            text = f.read()
        if path.endswith(".cu"):
            target = os.path.join(copy_root, rel[:-3] + "_emulated.cpp")
            _write_if_changed(target, rewrite_cu(text))
            sources.append(target)
        elif path.endswith(".cuh"):  # CUDA headers may hold kernels and launches too
            _write_if_changed(os.path.join(copy_root, rel), rewrite_cu(text))
        elif path.endswith("_cpu.cpp"):
            continue  # CPU kernels: the op files' CPU branches are dead code here (see on_device.h)
        elif path.endswith(".cpp"):
            target = os.path.join(copy_root, rel)
            _write_if_changed(target, rewrite_cpp(text))
            sources.append(target)
        else:
            _write_if_changed(os.path.join(copy_root, rel), text)
    sources += [os.path.join(HERE, "cuda_emulator.cpp"), os.path.join(HERE, "emulator_selftest.cpp")]
    return sources


_loaded = False


def load(verbose: bool = False):
    """Builds (if needed) and loads the emulated library; returns torch.ops.carbon_emu."""
    global _loaded
    if not _loaded:
        from torch.utils.cpp_extension import load as load_extension

        out_dir = build_directory()
        os.makedirs(out_dir, exist_ok=True)
        sources = prepare_sources(out_dir)
        build = os.path.join(out_dir, "build")
        os.makedirs(build, exist_ok=True)
        load_extension(
            name=NAME,
            sources=sources,
            extra_cflags=CXX_FLAGS,
            extra_ldflags=["-fopenmp"],
            extra_include_paths=[os.path.join(HERE, "include"), HERE, os.path.join(out_dir, "csrc")],
            build_directory=build,
            is_python_module=False,
            verbose=verbose,
        )
        _loaded = True
    return getattr(torch.ops, LIBRARY)


if __name__ == "__main__":
    load(verbose=True)
    print("loaded", LIBRARY, sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith(LIBRARY + "::")))
