"""Test setup: choose real CUDA or the CUDA simulator before numba.cuda is imported.

Without a usable GPU, CUDA kernels run under Numba's simulator (small shapes) and `gpu`-marked
tests are skipped. With a GPU, the same kernel tests run on the device and `gpu` tests run too.
"""
from __future__ import annotations

import os

import pytest

from coldkv.cuda_probe import cuda_present  # numba-free: must run before numba is imported

HAS_GPU = cuda_present()
if not HAS_GPU:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    __import__("cudasim_warp").install()  # warp intrinsics (ballot/shfl) for the simulator


@pytest.fixture(autouse=True, scope="session")
def _one_blas_thread():
    """OpenBLAS threads fight over the 2 shared cores of CI machines (20x slower decode measured)."""
    from coldkv.runtime.blas import blas_threads  # after the simulator switch above

    with blas_threads(1):
        yield


# modules whose gpu tests take minutes each (mostly compiling a model's kernels; 100-260 s at -n 12 on
# the H100): with a GPU they run first, since started last under pytest -n they are the suite's tail
_LONG_ON_GPU = ("test_cuda_backend.py", "test_jit_cache.py")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
    if HAS_GPU:  # a stable sort: the same order in every xdist worker
        items.sort(key=lambda item: item.path.name not in _LONG_ON_GPU)
