"""The paged KV cache of one sequence (host memory; the CPU backend's cache).

Layout (DEVELOPERS.md, "The KV page layout"): each layer has a K pool and a V pool, each in its own
format from the KV table; a pool is `codes [n_pages, page_tokens, code_cols]` + `scales [n_pages,
page_tokens, scale_cols]`; `gscale [2, kv_heads]` holds the fp32 second-level scale of the 4-bit
formats; the block table `[2, kv_heads, max_pages]` maps (K/V, head, page of the sequence) to a pool
page: >= 0 hot page, -1 unallocated, <= -2 a cold slot (`slot = -2 - entry`).

Pages are allocated as tokens arrive (`extend`, chunk by chunk during prefill), pools grow
geometrically, and `trim` returns pages to the pool's free list.

Second-level scale calibration (nvfp4, iso3): fixed per (layer, kv_head, K/V) from the first chunk
written, as global_scale_for(GSCALE_HEADROOM x amax of that head's values in the chunk). The
headroom lets later tokens reach 4x the first chunk's magnitude before their E4M3 block scales
saturate; it costs nothing in precision because E4M3 keeps 3 mantissa bits over its whole normal
range (448 down to 2^-6), which the block scales stay inside.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from coldkv.numba_kernels.attention import paged_attention_cpu
from coldkv.numba_kernels.layers import GSCALE_HEADROOM
from coldkv.runtime.kv_table import KVTable
from coldkv.numba_kernels.quant import FORMAT_IDS, append_cpu, global_scale_for, pool_arrays

TWO_LEVEL = ("nvfp4", "iso3")  # formats with a fp32 second-level scale


def free_stack(lo: int, hi: int) -> np.ndarray:
    """Pages lo .. hi - 1 as a free stack: the last entry is handed out first, so low indices go first."""
    return np.arange(hi - 1, lo - 1, -1, dtype=np.int32)


@dataclass
class Pool:
    """One plane kind (K or V) of one layer: pages in one format, with a free stack (the last
    entry is handed out first). An array, not a list: a 32k prompt maps ~16k pages at once, and
    the list's slicing and conversion took ~0.65 ms of host time before a prefill's first kernel."""

    fmt: str
    codes: np.ndarray  # [n_pages, page_tokens, code_cols]
    scales: np.ndarray  # [n_pages, page_tokens, scale_cols]
    free: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    @property
    def fmt_id(self) -> int:
        return FORMAT_IDS[self.fmt]

    @property
    def page_nbytes(self) -> int:
        return (self.codes.nbytes + self.scales.nbytes) // max(1, self.codes.shape[0])

    def grow(self, need: int, page_tokens: int, head_dim: int, cap: int) -> None:
        """Make at least `need` pages free. Capacity doubles (O(1) amortized copying) but never
        passes `cap`, the pages the whole request can use."""
        if len(self.free) >= need:
            return
        old = self.codes.shape[0]
        new = min(max(2 * old, 4), cap)
        new = max(new, old + need - len(self.free))
        codes, scales = pool_arrays(self.fmt, new, page_tokens, head_dim)
        codes[:old], scales[:old] = self.codes, self.scales
        self.codes, self.scales = codes, scales
        self.free = np.concatenate([self.free, free_stack(old, new)])


class PagedKVCache:
    def __init__(self, table: KVTable, n_kv_heads: int, head_dim: int, max_tokens: int, page_tokens: int = 64):
        self.table = table
        self.n_kv_heads, self.head_dim, self.page_tokens = n_kv_heads, head_dim, page_tokens
        self.max_tokens = max_tokens
        self.max_pages = -(-max_tokens // page_tokens)
        self.length = 0  # tokens stored (positions 0..length-1)
        self.pools: list[tuple[Pool, Pool]] = []  # per layer (K pool, V pool)
        for k_fmt, v_fmt in table.layers:
            self.pools.append((self._new_pool(k_fmt), self._new_pool(v_fmt)))
        n = table.n_layers
        self.block_table = np.full((n, 2, n_kv_heads, self.max_pages), -1, np.int32)  # [layer, K/V, head, page]
        self.gscale = np.ones((n, 2, n_kv_heads), np.float32)  # [layer, K/V, head]
        # second-level scales fixed for this layer? Layers without a two-level format have none
        # to fix (then the CUDA backend need not run their first chunk apart).
        self._two_level = np.array([any(f in TWO_LEVEL for f in kv) for kv in table.layers], bool)
        self.calibrated = ~self._two_level

    def _new_pool(self, fmt: str) -> Pool:
        """An empty host pool (it grows as tokens arrive); the device cache allocates its own."""
        return Pool(fmt, *pool_arrays(fmt, 0, self.page_tokens, self.head_dim))

    # -- sizes -------------------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.pools)

    def bytes_per_token(self) -> float:
        """KV bytes one token costs at page granularity (codes + scales, all layers, K and V)."""
        return kv_bytes_per_token(self.table, self.n_kv_heads, self.head_dim, self.page_tokens)

    @property
    def nbytes(self) -> int:
        """Bytes of the pages this sequence holds, plus the second-level scales."""
        pages = 0
        for layer, (kp, vp) in enumerate(self.pools):
            for plane, pool in enumerate((kp, vp)):
                used = int(np.count_nonzero(self.block_table[layer, plane] >= 0))
                pages += used * pool.page_nbytes
        return pages + sum(4 * self.n_kv_heads * sum(f in TWO_LEVEL for f in kv) for kv in self.table.layers)

    @property
    def reserved_nbytes(self) -> int:
        """Bytes of all pool pages, free ones included (the memory actually held)."""
        return sum(p.codes.nbytes + p.scales.nbytes for kv in self.pools for p in kv)

    # -- writing -----------------------------------------------------------------------------------
    def extend(self, n: int) -> int:
        """Make room for `n` more tokens in every layer; returns their first position."""
        pos0, end = self.length, self.length + n
        if end > self.max_tokens:
            raise ValueError(f"KV cache holds at most {self.max_tokens} tokens, asked for {end}")
        # pages 0 .. held-1 are held and no later one is (extend takes them in order, trim frees
        # only past the new end), so the new pages are exactly [held, last) of every head: no scan
        # of the table (a decode step inside a page then costs nothing here; it scanned 16+ table
        # segments, ~50 us of the host's time a step)
        held, last = -(-pos0 // self.page_tokens), -(-end // self.page_tokens)
        if last > held:
            H, k = self.n_kv_heads, self.n_kv_heads * (last - held)
            for layer, pools in enumerate(self.pools):
                for plane, pool in enumerate(pools):
                    pool.grow(k, self.page_tokens, self.head_dim, cap=H * self.max_pages)
                    # (head, page) in row-major order take the stack's top in turn, as a pop() loop
                    # would; vectorized because a 32k prompt maps ~16k pages here (the GPU idles)
                    self.block_table[layer, plane, :, held:last] = pool.free[:-k - 1:-1].reshape(H, last - held)
                    pool.free = pool.free[:-k]
        self.length = end
        return pos0

    def write(self, layer: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v [T, H, D] float32 (k after RoPE) -> positions pos0..pos0+T-1 of `layer`, quantized."""
        kp, vp = self.pools[layer]
        if not self.calibrated[layer]:
            for plane, (pool, x) in enumerate(((kp, k), (vp, v))):
                if pool.fmt in TWO_LEVEL:
                    amax = np.abs(x).max(axis=(0, 2))  # [H]
                    self.gscale[layer, plane] = [global_scale_for(float(GSCALE_HEADROOM) * float(a)) for a in amax]
            self.calibrated[layer] = True
        bt = self.block_table[layer]
        append_cpu(kp.fmt_id, np.ascontiguousarray(k, np.float32), pos0, bt[0], kp.codes, kp.scales, self.gscale[layer, 0])
        append_cpu(vp.fmt_id, np.ascontiguousarray(v, np.float32), pos0, bt[1], vp.codes, vp.scales, self.gscale[layer, 1])

    def trim(self, n: int) -> None:
        """Forget the last `n` tokens (speculative-decoding rollback); pages past the end go back to the pools."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot trim {n} of {self.length} tokens")
        self.length -= n
        keep = -(-self.length // self.page_tokens)
        for layer, pools in enumerate(self.pools):
            for plane, pool in enumerate(pools):
                tail = self.block_table[layer, plane, :, keep:]  # [H, pages past the end]
                held = tail >= 0
                pool.free = np.concatenate([pool.free, tail[held].astype(np.int32)])
                tail[held] = -1
        if self.length == 0:
            self.calibrated[:] = ~self._two_level

    # -- reading -----------------------------------------------------------------------------------
    def attend(self, layer: int, q: np.ndarray, pos0: int, sm_scale: float) -> np.ndarray:
        """q [T, Hq, D] float32 at positions pos0.. (already written) -> attention output [T, Hq, D]."""
        kp, vp = self.pools[layer]
        q = np.ascontiguousarray(q, np.float32)
        out = np.empty_like(q)
        paged_attention_cpu(q, out, pos0, sm_scale, kp.fmt_id, kp.codes, kp.scales, vp.fmt_id, vp.codes,
                            vp.scales, self.gscale[layer], self.block_table[layer])
        return out

    def dense(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Dequantized K, V [length, H, D] of a layer. For tests and analysis only: attention never uses it."""
        from coldkv.numba_kernels.quant import dequant_rows_cpu

        P, H, D = self.page_tokens, self.n_kv_heads, self.head_dim
        out = np.zeros((2, self.length, H, D), np.float32)
        tile = np.empty((P, D), np.float32)
        for plane, pool in enumerate(self.pools[layer]):
            for h in range(H):
                for p in range(-(-self.length // P)):
                    n = min(P, self.length - p * P)
                    dequant_rows_cpu(pool.fmt_id, pool.codes, pool.scales, self.block_table[layer, plane, h, p],
                                     0, n, self.gscale[layer, plane, h], tile[:n])
                    out[plane, p * P:p * P + n, h] = tile[:n]
        return out[0], out[1]


def kv_bytes_per_token(table: KVTable, n_kv_heads: int, head_dim: int, page_tokens: int = 64) -> float:
    total = 0
    for k_fmt, v_fmt in table.layers:
        for f in (k_fmt, v_fmt):
            codes, scales = pool_arrays(f, 1, page_tokens, head_dim)
            total += codes.nbytes + scales.nbytes
    return total * n_kv_heads / page_tokens
