"""GEMMs of the CUDA backend through cuBLAS, called via nvmath-python's low-level binding.

Why nvmath-python (docs/runtime.md): NVIDIA maintains it as the Python binding of the CUDA math
libraries; `nvmath.bindings.cublas` is a thin Cython layer that takes raw device pointers and a
stream, so Numba device arrays go in without a copy or a wrapper object, and its calls can be
captured into a CUDA graph with the Numba kernels around them. CuPy was the first choice, but its
binding refuses any cuBLAS call on a capturing stream (NotImplementedError, seen on the H200 with
CuPy 14.2); torch would bring its own allocator and stream semantics.

All products here are y[T, N] = x[T, K] (16-bit) @ w[N, K]^T (16-bit) (+ y when accumulate),
fp32 accumulation: the nn.Linear layout of HF checkpoints, row-major, read by cuBLAS as
column-major transposes (y^T = w . x^T). The 16-bit type is bf16, or fp16 for an fp16 checkpoint
(x and w alike: cuBLAS takes one input type). y is float32 (the residual stream the o_proj and
down GEMMs accumulate into), or uint16 bits of the 16-bit type, rounded once by cuBLAS (the QKV
and gate|up outputs, which their kernels read: half the bytes written and read, as HF's own
bf16 Linear outputs).
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from coldkv.errors import DeviceError

# cuBLAS / CUDA enum values (cublas_api.h, library_types.h)
_OP_N, _OP_T = 0, 1
_R_32F, _R_16F, _R_16BF = 0, 2, 14
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20  # set explicitly: captured GEMMs must not allocate


def device_ptr(a) -> int:
    return int(a.__cuda_array_interface__["data"][0])


class CublasGemm:
    """cuBLAS GEMMs on one (Numba) stream; inputs bf16, or fp16 when f16."""

    def __init__(self, stream, f16: bool = False):
        try:
            from nvmath.bindings import cublas
        except ImportError as exc:
            raise DeviceError(
                "the CUDA backend calls cuBLAS through nvmath-python, which is not installed: "
                "pip install 'coldkv[cuda]'"
            ) from exc
        self._cublas = cublas
        self._in = _R_16F if f16 else _R_16BF
        self._handle = cublas.create()
        cublas.set_stream(self._handle, int(stream.handle))  # resets the workspace: set it after
        self._workspace = cuda.device_array(WORKSPACE_BYTES, np.uint8)
        cublas.set_workspace(self._handle, device_ptr(self._workspace), WORKSPACE_BYTES)
        self._alpha = np.ones(1, np.float32)  # host scalars (cuBLAS' default pointer mode)
        self._beta = {False: np.zeros(1, np.float32), True: np.ones(1, np.float32)}

    def __call__(self, x, w, y, accumulate: bool = False) -> None:
        T, K = x.shape
        N = w.shape[0]
        if w.shape[1] != K or y.shape != (T, N):
            raise ValueError(f"gemm shapes: x {x.shape}, w {w.shape}, y {y.shape}")
        if y.dtype not in (np.float32, np.uint16) or (accumulate and y.dtype != np.float32):
            raise ValueError(f"gemm output: float32, or uint16 16-bit bits without accumulate; got {y.dtype}")
        self._cublas.gemm_ex(
            self._handle, _OP_T, _OP_N, N, T, K,
            self._alpha.ctypes.data, device_ptr(w), self._in, K,
            device_ptr(x), self._in, K,
            self._beta[accumulate].ctypes.data, device_ptr(y), _R_32F if y.dtype == np.float32 else self._in, N,
            _COMPUTE_32F, _GEMM_DEFAULT)

    def __del__(self):
        try:
            self._cublas.destroy(self._handle)
        except Exception:  # interpreter shutdown
            pass
