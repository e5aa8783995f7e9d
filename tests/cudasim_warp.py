"""Warp intrinsics for Numba's CUDA simulator (which has none).

The simulator runs every CUDA thread of a block as a Python thread. `install()` adds
ballot_sync, shfl_sync, shfl_up/down/xor_sync, syncwarp, activemask and lanemask_lt to its fake
`cuda` module. Each warp of a block gets a `threading.Barrier` over its live threads: a collective
stores every lane's value, waits, reads, and waits again before the slots can be reused.

Limits (kernels here are written to them): every thread of a warp calls the same collectives in
the same order (converged warps, full masks); partial warps of a short last block work, threads
that returned early must not be waited for (the barrier counts threads of the block, so do not
exit early in a warp that later runs a collective).
"""
from __future__ import annotations

import threading

_TIMEOUT_S = 120.0  # a diverged warp fails loudly instead of hanging the test run
_lock = threading.Lock()


class _WarpState:
    def __init__(self, size: int):
        self.barrier = threading.Barrier(size, timeout=_TIMEOUT_S)
        self.values = [None] * 32


def _warp():
    """(state, lane) of the calling simulator thread."""
    t = threading.current_thread()
    manager = t._manager
    bx, by, bz = manager._block_dim
    block_threads = bx * by * bz
    warp = t.thread_id // 32
    key = (tuple(t.blockIdx), warp)
    with _lock:
        table = manager.__dict__.setdefault("_coldkv_warps", {})
        state = table.get(key)
        if state is None:
            state = table[key] = _WarpState(min(32, block_threads - 32 * warp))
    return state, t.thread_id % 32


def _exchange(value):
    """All lanes publish `value`; returns the list of the warp's values (None for absent lanes)."""
    state, lane = _warp()
    state.values[lane] = value
    state.barrier.wait()
    values = list(state.values)
    state.barrier.wait()
    return values, lane


def ballot_sync(self, mask, predicate):
    values, _ = _exchange(bool(predicate))
    return sum(1 << i for i, v in enumerate(values) if v and (mask >> i) & 1)


def shfl_sync(self, mask, value, src_lane):
    values, _ = _exchange(value)
    return values[src_lane % 32]


def shfl_up_sync(self, mask, value, delta):
    values, lane = _exchange(value)
    return values[lane - delta] if lane >= delta else value


def shfl_down_sync(self, mask, value, delta):
    values, lane = _exchange(value)
    src = lane + delta
    return values[src] if src < 32 and values[src] is not None else value


def shfl_xor_sync(self, mask, value, lane_mask):
    values, lane = _exchange(value)
    src = lane ^ lane_mask
    return values[src] if values[src] is not None else value


def syncwarp(self, mask=0xFFFFFFFF):
    _exchange(None)


def activemask(self):
    values, _ = _exchange(True)
    return sum(1 << i for i, v in enumerate(values) if v)


def lanemask_lt(self):
    return (1 << (threading.current_thread().thread_id % 32)) - 1


def install() -> None:
    """Add the intrinsics to the simulator's fake cuda module (idempotent)."""
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    for fn in (ballot_sync, shfl_sync, shfl_up_sync, shfl_down_sync, shfl_xor_sync, syncwarp,
               activemask, lanemask_lt):
        setattr(FakeCUDAModule, fn.__name__, fn)
