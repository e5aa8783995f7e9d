"""GEMMs of the CUDA backend through cuBLAS, called via CuPy's low-level binding.

Why CuPy (docs/runtime.md): it is maintained, it is already on typical CUDA Python installs (and on
our H200 image), and `cupy_backends.cuda.libs.cublas.gemmEx` takes raw device pointers and a
stream, so Numba device arrays go in without a copy or a wrapper object, and the calls can be
captured into a CUDA graph with the Numba kernels around them. nvmath-python would do too but is
one more large dependency; torch would bring its own allocator and stream semantics.

All products here are y[T, N] (f32) = x[T, K] (bf16) @ w[N, K]^T (bf16) (+ y when accumulate),
fp32 accumulation: the nn.Linear layout of HF checkpoints, row-major, read by cuBLAS as
column-major transposes (y^T = w . x^T).
"""
from __future__ import annotations

import numpy as np

from coldkv.errors import DeviceError

# cuBLAS / CUDA enum values (cublas_api.h, library_types.h)
_OP_N, _OP_T = 0, 1
_R_32F, _R_16BF = 0, 14
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1


def device_ptr(a) -> int:
    return int(a.__cuda_array_interface__["data"][0])


class CublasGemm:
    """cuBLAS GEMMs on one (Numba) stream."""

    def __init__(self, stream):
        try:
            import cupy
            from cupy_backends.cuda.libs import cublas
        except ImportError as exc:
            raise DeviceError(
                "the CUDA backend calls cuBLAS through CuPy, which is not installed: "
                "pip install 'coldkv[cuda]' (or cupy-cuda12x for a CUDA 12 driver)"
            ) from exc
        self._cublas = cublas
        self._stream = cupy.cuda.ExternalStream(int(stream.handle))
        self._handle = cupy.cuda.device.get_cublas_handle()
        self._alpha = np.ones(1, np.float32)  # host scalars (cuBLAS' default pointer mode)
        self._beta = {False: np.zeros(1, np.float32), True: np.ones(1, np.float32)}

    def __call__(self, x, w, y, accumulate: bool = False) -> None:
        T, K = x.shape
        N = w.shape[0]
        if w.shape[1] != K or y.shape != (T, N):
            raise ValueError(f"gemm shapes: x {x.shape}, w {w.shape}, y {y.shape}")
        with self._stream:  # CuPy binds its current stream to the handle on each call
            self._cublas.gemmEx(
                self._handle, _OP_T, _OP_N, N, T, K,
                self._alpha.ctypes.data, device_ptr(w), _R_16BF, K,
                device_ptr(x), _R_16BF, K,
                self._beta[accumulate].ctypes.data, device_ptr(y), _R_32F, N,
                _COMPUTE_32F, _GEMM_DEFAULT)
