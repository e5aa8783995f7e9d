"""Is there a usable CUDA GPU? Asked of the driver directly: no numba import, no CUDA context.

Kept free of numba imports so the test setup can call it before choosing the CUDA simulator.
"""
from __future__ import annotations

import ctypes


def cuda_present() -> bool:
    """True when the CUDA driver loads and reports at least one device."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        return lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    return False
