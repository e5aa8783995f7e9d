"""Capture a sequence of launches on a stream into a CUDA graph and replay it, and copy between
pinned host and device arrays in one driver call (cuda.bindings).

A Numba launch costs tens of microseconds of Python; a decode step of a model is ~10 launches
per layer, so the CUDA backend captures the whole step once and replays it with one call.
Everything a replay must see change (token ids, the position, the block table) lives in device
buffers that the host updates before each replay; kernel arguments are frozen at capture.
"""
from __future__ import annotations

from collections.abc import Callable

from cuda.bindings import driver as cu
from numba import cuda


def _check(result):
    err, *rest = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver error {err.name}")
    return rest[0] if len(rest) == 1 else rest


class CapturedGraph:
    def __init__(self, stream, record: Callable[[], None]):
        """Runs `record()` (which enqueues work on `stream`) under stream capture. Relaxed mode:
        other threads' CUDA calls (e.g. allocations) are not errors while capturing. Numba's
        deferred frees are held back meanwhile: a garbage collection inside record() (a dropped
        cache or backend) could flush them, and a cuMemFree during the capture invalidates it.
        That is our reading of a CUDA_ERROR_STREAM_CAPTURE_INVALIDATED on the H200 at bea2e6d, in
        the test after one that failed holding a second backend; not reproduced on purpose."""
        self._stream = cu.CUstream(int(stream.handle))
        with cuda.defer_cleanup():
            _check(cu.cuStreamBeginCapture(self._stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
            try:
                record()
            finally:
                graph = _check(cu.cuStreamEndCapture(self._stream))
        self._graph = graph
        self._exec = _check(cu.cuGraphInstantiate(graph, 0))

    def launch(self) -> None:
        _check(cu.cuGraphLaunch(self._exec, self._stream))

    def __del__(self):
        try:
            cu.cuGraphExecDestroy(self._exec)
            cu.cuGraphDestroy(self._graph)
        except Exception:  # interpreter shutdown
            pass


class PinnedCopy:
    """One async copy, fixed at construction, between a pinned host array and a device array of the
    same bytes: one driver call (cuMemcpyHtoDAsync / cuMemcpyDtoHAsync) when called. numba's
    copy_to_device / copy_to_host spend tens of microseconds of Python a call (views of both arrays,
    checks): under cProfile on an H100's host, the position upload took 0.16 of the 0.33 ms that
    enqueueing a pipelined decode step took (bench/results/logs/decode_host_profile_h100_0843646.json)."""

    def __init__(self, device, host, stream, to_device: bool):
        if device.nbytes != host.nbytes:
            raise ValueError(f"copy of {host.nbytes} host bytes to {device.nbytes} device bytes")
        self._arrays = (device, host)  # kept alive: the call holds only their addresses
        dptr, hptr, s = device.device_ctypes_pointer.value, host.ctypes.data, cu.CUstream(int(stream.handle))
        self._call = (cu.cuMemcpyHtoDAsync, dptr, hptr, host.nbytes, s) if to_device else \
            (cu.cuMemcpyDtoHAsync, hptr, dptr, host.nbytes, s)

    def __call__(self) -> None:
        fn, dst, src, n, s = self._call
        _check(fn(dst, src, n, s))
