import atexit
import os
import shutil
import tempfile

# torch.compile's on-disk caches (inductor's FX graph cache, AOTAutograd's cache) are keyed on the
# traced graph, not on the Python autograd formulas of carbon's ops: a graph compiled by an older
# carbon could be reused with backward ops that no longer exist. Each test session compiles afresh.
# The directory is removed when the session ends, so repeated runs do not fill /tmp.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _inductor_cache = tempfile.mkdtemp(prefix="carbon-tests-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _inductor_cache
    atexit.register(shutil.rmtree, _inductor_cache, ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402

# CARBON_TEST_EMULATED_KERNELS=1: every carbon op runs carbon's CUDA kernels on the CPU emulator
# (tests/cuda_emulator/swap_in.py), so the CPU tests check the GPU's kernels against their references.
if os.environ.get("CARBON_TEST_EMULATED_KERNELS") == "1":
    from cuda_emulator.swap_in import use_emulated_kernels

    _emulated_kernels = use_emulated_kernels()

    def pytest_terminal_summary(terminalreporter):
        """How many emulated CUDA kernels ran (so a run that silently fell back to the CPU kernels shows)."""
        terminalreporter.write_line(f"emulated CUDA launches: {int(torch.ops.carbon_emu._emu_launches())}")

    def pytest_collection_modifyitems(config, items):
        """Tests of what only the CPU kernels do (marked cpu_kernels) do not apply to the CUDA kernels: on CUDA,
        an out-of-range index is ignored rather than checked on the host (contract §11)."""
        skip = pytest.mark.skip(reason="checks carbon's CPU kernels only (CARBON_TEST_EMULATED_KERNELS=1)")
        for item in items:
            if "cpu_kernels" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def restore_num_threads():
    """Tests may change torch's intra-op thread count; put it back afterwards."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


@pytest.fixture
def carbon_disabled_after():
    """A test that enables carbon must not leave it enabled for the next one, even when it fails."""
    yield
    import carbon
    carbon.disable()


# For test modules that should run only with a GPU: `pytestmark = ON_GPU`.
ON_GPU = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
