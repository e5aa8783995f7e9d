"""Stand-ins that let the CUDA backend (runtime/cuda_backend.py) run under Numba's CUDA simulator.

- `NumpyGemm`: cuBLAS's contract (y (+)= x @ w^T, x and w 16-bit, fp32 out) on the simulator's
  host-backed arrays.
- `cpu_paged_attention`: the CPU attention kernel in place of the CUDA one, for tests of the host
  logic: the simulated fp32 attention kernel takes ~1 min a launch here, and
  tests/test_attention_cuda.py checks that kernel against the same reference.
- `sync_event`: the simulator's `cuda.event` takes no `timing` argument.
- `ArrayCopy`: cuda_graph.PinnedCopy's contract by the arrays' own copies (the simulator's arrays
  have no device addresses for a driver call).
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from coldkv.numba_kernels.attention import paged_attention_cpu
from coldkv.numba_kernels.layers import ref_decode16, ref_encode16

_sim_event = cuda.event


class NumpyGemm:
    def __init__(self, stream, f16: bool = False):
        self.f16 = f16

    def __call__(self, x, w, y, accumulate: bool = False) -> None:
        r = (ref_decode16(x.copy_to_host(), self.f16).astype(np.float64)
             @ ref_decode16(w.copy_to_host(), self.f16).astype(np.float64).T).astype(np.float32)
        if y.dtype == np.uint16:  # 16-bit output bits, rounded once (as cuBLAS does)
            y.copy_to_device(ref_encode16(r, self.f16))
        else:
            y.copy_to_device(r + y.copy_to_host() if accumulate else r)


def cpu_paged_attention(q, out, pos0, sm_scale, k_fmt, k_codes, k_scales, v_fmt, v_codes, v_scales, gscale, table,
                        ws, stream=0, **kernel_options):
    """paged_attention_cuda's contract by attention.paged_attention_cpu. pos0 an int, or the
    backend's device [first position, valid tokens] (graph mode): rows past the valid ones (a
    padded chunk) are left at zero."""
    T = q.shape[0]
    if not isinstance(pos0, (int, np.integer)):
        pos0, T = (int(v) for v in pos0.copy_to_host()[:2])
    qh = np.ascontiguousarray(q.copy_to_host()[:T])
    o = np.zeros(out.shape, np.float32)
    paged_attention_cpu(qh, o[:T], pos0, sm_scale, k_fmt, k_codes.copy_to_host(), k_scales.copy_to_host(), v_fmt,
                        v_codes.copy_to_host(), v_scales.copy_to_host(), gscale.copy_to_host(), table.copy_to_host())
    out.copy_to_device(o)


class ArrayCopy:
    def __init__(self, device, host, stream, to_device: bool):
        self.device, self.host, self.stream, self.to_device = device, host, stream, to_device

    def __call__(self) -> None:
        if self.to_device:
            self.device.copy_to_device(self.host, stream=self.stream)
        else:
            self.device.copy_to_host(self.host, stream=self.stream)


def sync_event(timing: bool = True):
    return _sim_event()
