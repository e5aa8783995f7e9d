"""Test setup: choose real CUDA or the CUDA simulator before numba.cuda is imported.

Without a usable GPU, CUDA kernels run under Numba's simulator (small shapes) and `gpu`-marked
tests are skipped. With a GPU, the same kernel tests run on the device and `gpu` tests run too.
"""
from __future__ import annotations

import ctypes
import os

import pytest


def _gpu_present() -> bool:
    """True when the CUDA driver loads and reports at least one device (no numba import)."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        return lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    return False


HAS_GPU = _gpu_present()
if not HAS_GPU:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    __import__("cudasim_warp").install()  # warp intrinsics (ballot/shfl) for the simulator


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
