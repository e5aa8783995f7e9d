"""The paged KV cache in GPU memory (the CUDA backend's cache).

Same layout and bookkeeping as the host cache (kv_cache.PagedKVCache: block table, free lists,
extend / trim, sizes); what differs:
  - each pool is allocated once, at the capacity the request can use (kv heads x pages of
    max_tokens), because captured CUDA graphs hold its address; pages are still handed out from
    the free list as tokens arrive and returned by trim, so the block table is a real indirection;
  - the block table lives in pinned host memory and is copied to the device (`sync`) after
    extend / trim changed it; the second-level scales are computed and kept on the device.
  - that memory is a DeviceKVArena, which the CUDA backend hands to the next cache of the same
    table and size once this one is gone, so the graphs captured on its addresses stay valid.
The backend writes and reads the pages with its kernels; `to_host()` copies everything back into
a host PagedKVCache (tests, analysis).
"""
from __future__ import annotations

import numpy as np
from numba import cuda
from numba.cuda.cudadrv.driver import device_memset

from coldkv.errors import PlanError
from coldkv.numba_kernels.quant import pool_arrays
from coldkv.runtime.kv_cache import TWO_LEVEL, PagedKVCache, Pool, free_stack
from coldkv.runtime.kv_table import KVTable


class DevicePool(Pool):
    def grow(self, need: int, page_tokens: int, head_dim: int, cap: int) -> None:
        if len(self.free) < need:  # cannot happen: the pool holds every page the request can use
            raise PlanError(f"device KV pool ({self.fmt}) is out of pages")


def _device_zeros(shape, dtype):
    d = cuda.device_array(shape, dtype)
    if d.nbytes:
        device_memset(d, 0, d.nbytes)
    return d


class DeviceKVArena:
    """The device memory of a DevicePagedKVCache: every pool at capacity, the block table (pinned
    host copy and device copy) and the second-level scales. The CUDA backend keeps the last arena
    and gives it to the next cache of the same shape once the previous cache is gone, so the CUDA
    graphs captured on these addresses are replayed instead of captured again (~10-20 ms of
    Python per new cache)."""

    def __init__(self, table: KVTable, n_kv_heads: int, head_dim: int, max_pages: int, page_tokens: int,
                 prefill_scratch: bool = True):
        self.key = arena_key(table, n_kv_heads, head_dim, max_pages * page_tokens, page_tokens, prefill_scratch)
        cap, n = n_kv_heads * max_pages, table.n_layers
        self.pools = []  # per layer: ((K codes, K scales), (V codes, V scales)), [cap pages, page_tokens, cols]
        for kv in table.layers:
            planes = []
            for f in kv:
                codes, scales = pool_arrays(f, 1, page_tokens, head_dim)  # one page: dtypes, shapes
                planes.append((_device_zeros((cap,) + codes.shape[1:], codes.dtype),
                               _device_zeros((cap,) + scales.shape[1:], scales.dtype)))
            self.pools.append(tuple(planes))
        # the block table and the second-level scales share one pinned buffer and one device buffer, so
        # a fresh cache uploads both in one copy (each copy costs the host ~50-100 us before a prompt's
        # first kernel: kernels.md Prefill 0 (a)); the scales are uploaded once, then kernels write them
        nt, ng = n * 2 * n_kv_heads * max_pages, n * 2 * n_kv_heads
        self.upload_host = cuda.pinned_array(nt + ng, np.int32)  # [table | scales as int32 bits]
        self.upload_dev = cuda.device_array(nt + ng, np.int32)
        self.block_table = self.upload_host[:nt].reshape(n, 2, n_kv_heads, max_pages)  # [layer, K/V, head, page]
        self.table_dev = self.upload_dev[:nt].reshape(self.block_table.shape)
        self.gscale_host = self.upload_host[nt:].view(np.float32).reshape(n, 2, n_kv_heads)  # [layer, K/V, head]
        self.gscale_dev = self.upload_dev[nt:].view(np.float32).reshape(n, 2, n_kv_heads)
        # [layer, K/V] 1 where the plane's format has a second-level scale to calibrate
        self.two_level_dev = cuda.to_device(np.array([[f in TWO_LEVEL for f in kv] for kv in table.layers], np.int32))
        # (K, V) the 4-bit planes of one layer decoded to 16-bit rows for the "fa" prefill kernel,
        # shared by the layers in turn: [pool rows * head_dim / 2] uint32, empty where no layer has a
        # 4-bit plane; None without prefill_scratch (the "wg" kernel decodes in its blocks)
        self.prefill_scratch = tuple(cuda.device_array(cap * page_tokens * head_dim // 2 * four_bit, np.uint32)
                                     for four_bit in four_bit_planes(table)) if prefill_scratch else None

    @property
    def nbytes(self) -> int:
        """Device bytes (== device_kv_nbytes of its shape)."""
        small = self.upload_dev.nbytes + self.two_level_dev.nbytes
        return sum(a.nbytes for layer in self.pools for plane in layer for a in plane) + small + \
            sum(a.nbytes for a in self.prefill_scratch or ())


def arena_key(table: KVTable, n_kv_heads: int, head_dim: int, max_tokens: int, page_tokens: int,
              prefill_scratch: bool = True) -> tuple:
    """What must match for a cache to reuse an arena: the formats, heads, head_dim, page count and
    whether it holds the prefill scratch."""
    return (tuple(tuple(kv) for kv in table.layers), n_kv_heads, head_dim, -(-max_tokens // page_tokens), page_tokens,
            prefill_scratch)


def four_bit_planes(table: KVTable) -> tuple[bool, bool]:
    """(K, V): does some layer store that plane in a 4-bit format (nvfp4/iso3, the two-level ones)?"""
    return tuple(any(kv[i] in TWO_LEVEL for kv in table.layers) for i in (0, 1))


class DevicePagedKVCache(PagedKVCache):
    def __init__(self, table: KVTable, n_kv_heads: int, head_dim: int, max_tokens: int, page_tokens: int = 64,
                 arena: DeviceKVArena | None = None, prefill_scratch: bool = True):
        """arena: device memory to reuse (a cache of the same shape that is gone; its pages are
        stale and are only read after this cache writes them); None or another shape: a new one.
        prefill_scratch: allocate the 16-bit planes the "fa" prefill kernel reads 4-bit pages from
        (one layer's worth; the "wg" kernel, Hopper's default, does without)."""
        key = arena_key(table, n_kv_heads, head_dim, max_tokens, page_tokens, prefill_scratch)
        if arena is None or arena.key != key:
            arena = DeviceKVArena(table, n_kv_heads, head_dim, -(-max_tokens // page_tokens), page_tokens,
                                  prefill_scratch)
        self.arena = arena
        self._planes = iter(plane for layer in arena.pools for plane in layer)
        super().__init__(table, n_kv_heads, head_dim, max_tokens, page_tokens)
        del self._planes
        arena.block_table[:] = self.block_table
        arena.gscale_host[:] = self.gscale
        self.block_table, self.gscale = arena.block_table, arena.gscale_host
        self.table_dev, self.gscale_dev, self.two_level_dev = arena.table_dev, arena.gscale_dev, arena.two_level_dev
        # uploaded in stream order by the first sync(): a reused arena may still be read by work queued before
        self._dirty = self._fresh_scales = True

    @property
    def capacity(self) -> int:
        """Tokens the pools hold (>= max_tokens): what graph-mode attention plans for, and where a
        padded prefill pass may write."""
        return self.max_pages * self.page_tokens

    def _new_pool(self, fmt: str) -> DevicePool:
        codes, scales = next(self._planes)
        return DevicePool(fmt, codes, scales, free_stack(0, codes.shape[0]))

    def extend(self, n: int) -> int:
        pages_before = -(-self.length // self.page_tokens)
        pos0 = super().extend(n)
        self._dirty |= -(-self.length // self.page_tokens) > pages_before
        return pos0

    def trim(self, n: int) -> None:
        super().trim(n)
        self._dirty = True

    def sync(self, stream) -> None:
        """Enqueue the block table's upload if extend/trim changed it, and a new cache's scales, in
        one copy (async: pinned memory; the caller keeps the host table unchanged until the stream
        has passed this point)."""
        nt = self.block_table.size
        lo = 0 if self._dirty else nt  # [table | scales]
        hi = len(self.arena.upload_host) if self._fresh_scales else nt
        if lo < hi:
            self.arena.upload_dev[lo:hi].copy_to_device(self.arena.upload_host[lo:hi], stream=stream)
        self._dirty = self._fresh_scales = False

    def write(self, *args, **kwargs):
        raise TypeError("a device KV cache is written by the CUDA backend's kernels")

    def attend(self, *args, **kwargs):
        raise TypeError("a device KV cache is read by the CUDA backend's attention kernels")

    def to_host(self) -> PagedKVCache:
        """A host cache holding a copy of these pages, table and scales."""
        host = PagedKVCache(self.table, self.n_kv_heads, self.head_dim, self.max_tokens, self.page_tokens)
        host.length = self.length
        host.block_table[:] = self.block_table
        host.gscale[:] = self.gscale if self._fresh_scales else self.gscale_dev.copy_to_host()
        host.calibrated[:] = self.calibrated
        for pools, dev in zip(host.pools, self.pools):
            for pool, d in zip(pools, dev):
                pool.codes, pool.scales = d.codes.copy_to_host(), d.scales.copy_to_host()
        return host

    def dense(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        return self.to_host().dense(layer)


def device_kv_nbytes(table: KVTable, n_kv_heads: int, head_dim: int, max_tokens: int, page_tokens: int,
                     prefill_scratch: bool = True) -> int:
    """Device bytes a DevicePagedKVCache of max_tokens allocates (all pools at capacity, its table
    and scales, and with prefill_scratch the 16-bit planes of one layer's 4-bit planes)."""
    max_pages = -(-max_tokens // page_tokens)
    total = 0
    for kv in table.layers:
        for f in kv:
            codes, scales = pool_arrays(f, 1, page_tokens, head_dim)
            total += (codes.nbytes + scales.nbytes) * n_kv_heads * max_pages
    scratch = sum(four_bit_planes(table)) * n_kv_heads * max_pages * page_tokens * head_dim * 2 * prefill_scratch
    small = table.n_layers * 2 * (n_kv_heads * max_pages * 4 + n_kv_heads * 4 + 4)  # table, gscale, two_level
    return total + small + scratch
