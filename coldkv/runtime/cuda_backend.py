"""The CUDA backend: the same forward pass as runtime/model.py on one GPU.

Per layer: RMSNorm -> QKV GEMM -> fused (bias, q/k norm, RoPE, quantize-append of K/V into the
layer's pages) -> paged attention over every page format -> o_proj GEMM accumulating into the
residual -> RMSNorm -> gate/up GEMM -> SwiGLU -> down GEMM accumulating into the residual.
GEMMs are cuBLAS (16-bit weights as in the checkpoint: fp16 for an fp16 checkpoint, else bf16;
activations rounded to the same type; fp32 accumulate and output, runtime/gemm.py); everything
else is Numba kernels (numba_kernels/layers.py, attention_cuda.py, quant.py). All work runs on one
stream. A pass is ~90 Numba launches at ~0.1 ms of Python each (measured: 10 ms to enqueue a
512-token chunk of the 8-layer bundled model), so decode steps and full prefill chunks are
captured once per cache as CUDA graphs and replayed (runtime/cuda_graph.py), and a prompt's chunks
are enqueued without waiting for each.

Numerics vs the CPU backend: the CPU keeps activations in float32 with fp32 copies of the
weights; here the rows entering a GEMM are rounded to the checkpoint's 16-bit type first (as HF
transformers does in that dtype), so logits differ by a small bound (tests/test_cuda_backend.py
states it).
"""
from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import cuda

from coldkv.errors import PlanError
from coldkv.numba_kernels import layers as L
from coldkv.numba_kernels.attention_cuda import AttentionWorkspace, _sm_count, paged_attention_cuda, prefill_kernel
from coldkv.numba_kernels.attention_prefill import prefill_tokens_per_block
from coldkv.numba_kernels.sampling import launch_sample
from coldkv.runtime.backend import sequential_decode_steps
from coldkv.runtime.config import ModelArgs
from coldkv.runtime.cuda_graph import CapturedGraph, PinnedCopy
from coldkv.runtime.gemm import CublasGemm
from coldkv.runtime.kv_cache_cuda import DeviceKVArena, DevicePagedKVCache, arena_key, device_kv_nbytes
from coldkv.runtime.kv_table import KVTable
from coldkv.runtime.rope import Rope
from coldkv.runtime.sampling import Sampler

# Tokens per device pass (longer inputs are split): at least 2048, not 512, because a chunk costs
# ~90 launches however long it is and the first chunks of every prompt run eagerly (~10 ms of
# Python each). With the fa prefill kernel, up to 8192 while its grid would not fill the GPU
# unsplit; with the wgmma ones (sm_90), up to 32768: a 32k prompt in one pass a layer was 2.8%
# faster end to end than four 8192-token passes with nvfp4 KV, 4% with int8 (H100, 2ffeb58,
# bench/results/logs/generate_32k_chunks_h100_2ffeb58.json). prefill_chunk_tokens.
MIN_CHUNK, FA_MAX_CHUNK, MAX_CHUNK = 2048, 8192, 32768
# A chunk shorter than the backend's (a short prompt, a prompt's last chunk) runs as a pass of
# padded_rows(T) rows (its tokens, then token 0 up to the padding), so that a few captured graphs
# per cache serve every length instead of ~90 launches from Python (13 ms for a 4096-token prompt
# on the H200 whose GPU work is 2.5 ms). Caches hold a multiple of PAD_QUANTUM tokens so the
# padding always fits.
PAD_QUANTUM = 1024
CHUNK_BUFFER_BYTES = 1 << 30  # at most this much of per-token activation buffers
# The 4-bit KV scales of a layer are calibrated on its first chunk's first CALIB_TOKENS tokens:
# an fp32 K/V pass and an amax over them. Over a whole 32768-token pass they cost 1.7 of its 27.7 ms
# of GPU time (H100, 2ffeb58, bench/results/logs/prefill_profile_chunk32768_h100_2ffeb58.json);
# 8192 is what the 8192-token chunks calibrated on before.
CALIB_TOKENS = 8192
LOGITS_CHUNK = 512  # rows per pass when every position's logits are wanted ([rows, vocab] f32 buffer)
DECODE_SPLITS = 1024  # attention split-K capacity of a one-token step (128k tokens: 256 used)
PREFILL_SPLITS = 4  # x chunk rows of attention workspace; shorter chunks may split more


def prefill_chunk_tokens(a: ModelArgs, n_sm: int, prefill: str = "fa") -> int:
    """Tokens per prefill pass for model `a` on a GPU of n_sm SMs whose prefill attention kernel
    is `prefill` (PREFILL_KERNELS' mma_prefill: "fa" or "wg"), at most CHUNK_BUFFER_BYTES of buffers.
    "wg": MAX_CHUNK. Longer passes mean fewer launches, GEMMs of HF's sizes, and one attention
    launch a layer whose blocks run heaviest first over the whole prompt, not four with a tail each.
    "fa": it runs blocks of 4 warps x 16 // G query tokens per kv head and holds 2 blocks per SM
    (240-255 registers); a chunk whose grid fills those 2 n_sm slots runs unsplit and writes its
    output directly, a smaller one is split over the keys and merged by a second kernel. So the
    chunk doubles from MIN_CHUNK until the grid fills the GPU (the bundled model, 2 kv heads of
    G 2: 8192 tokens; 8 kv heads of G 4: 2048), at most FA_MAX_CHUNK (longer fa passes are unmeasured)."""
    nq, nkv = a.num_attention_heads, a.num_key_value_heads
    tokens_per_block = prefill_tokens_per_block(max(1, nq // nkv))

    def grow(T):
        if chunk_buffer_bytes(a, 2 * T) > CHUNK_BUFFER_BYTES:
            return False
        if prefill == "wg":
            return T < MAX_CHUNK
        return T < FA_MAX_CHUNK and -(-T // tokens_per_block) * nkv < 2 * n_sm

    T = MIN_CHUNK
    while grow(T):
        T *= 2
    return T


def chunk_buffer_bytes(a: ModelArgs, T: int) -> int:
    """Device bytes of the per-token buffers of a T-token prefill pass, an upper bound (_alloc_buffers'
    rows, counting the 16-bit qkv and gate|up rows at 4 bytes, and the attention workspace of
    PREFILL_SPLITS splits)."""
    hd, nq, nkv = a.head_dim, a.num_attention_heads, a.num_key_value_heads
    per_token = (4 * a.hidden_size + 2 * a.hidden_size + 2 * nq * hd + 4 * (nq + 2 * nkv) * hd + 8 * nq * hd
                 + 8 * a.intermediate_size + 2 * a.intermediate_size + 4 * PREFILL_SPLITS * nq * hd)
    return T * per_token + min(T, CALIB_TOKENS) * 8 * nkv * hd


def padded_rows(T: int) -> int:
    """Rows of the pass that runs a chunk of T tokens: powers of two from 256 to PAD_QUANTUM, then
    multiples of PAD_QUANTUM (at most 1.33x the work above 3072 tokens)."""
    if T > PAD_QUANTUM:
        return -(-T // PAD_QUANTUM) * PAD_QUANTUM
    return max(256, 1 << (T - 1).bit_length())


def cache_tokens(max_tokens: int) -> int:
    """The capacity a cache for max_tokens gets (room for a padded last chunk)."""
    return -(-max(1, max_tokens) // PAD_QUANTUM) * PAD_QUANTUM


@dataclass
class DeviceLayer:
    attn_norm: object  # [dim] f32
    wqkv: object  # [(nq + 2 nkv) hd, dim] 16-bit bits (bf16, or fp16 when f16)
    bqkv: object  # [(nq + 2 nkv) hd] f32, or empty
    q_norm: object  # [hd] f32, or empty
    k_norm: object
    wo: object  # [dim, nq hd] 16-bit
    bo: object | None  # [dim] f32
    mlp_norm: object
    w_gate_up: object  # [2 inter, dim] 16-bit
    w_down: object  # [dim, inter] 16-bit


def _f32(a: np.ndarray | None):
    """A float32 device copy of a vector (norms, biases), or an empty array for None."""
    return cuda.to_device(a if a is not None else np.zeros(0, np.float32))


class CUDABackend:
    name = "cuda"

    def __init__(self, model_dir: Path, args: ModelArgs | None = None, page_tokens: int = 64,
                 graphs: bool = True, prefill_attention: str = "auto", prefill_chunk: int | None = None,
                 pipelined_decode: bool = True):
        """graphs: replay captured passes; pipelined_decode: run decode_steps one step ahead of the
        host; prefill_attention: the prefill attention kernel (attention_cuda.prefill_kernel:
        "auto" or a name of PREFILL_KERNELS); prefill_chunk: tokens of a prefill
        pass, a multiple of PAD_QUANTUM (None: prefill_chunk_tokens). All but the defaults are
        for benchmarks' A/Bs."""
        from coldkv.runtime.loader import checkpoint_dtype, load_args, load_weights

        self.args = a = args or load_args(model_dir)
        if a.head_dim % 64 or a.head_dim > L.MAX_HEAD_DIM:
            raise PlanError(f"the CUDA backend needs head_dim a multiple of 64 up to {L.MAX_HEAD_DIM}, "
                            f"this model has {a.head_dim}; use --device cpu")
        if a.hidden_size > L.MAX_ROW:
            raise PlanError(f"the CUDA backend's RMSNorm takes rows of up to {L.MAX_ROW} values, this model's "
                            f"hidden size is {a.hidden_size}; use --device cpu")
        if a.intermediate_size % 2:
            raise PlanError(f"the CUDA backend's SwiGLU takes an even MLP width, this model's is "
                            f"{a.intermediate_size}; use --device cpu")
        self.page_tokens, self.graphs, self.pipelined_decode = page_tokens, graphs, pipelined_decode
        kernel = prefill_kernel(prefill_attention, a.head_dim)
        # paged_attention_cuda's keywords (mma_prefill, mma_warps, ...) for chunks of more than one token
        # ("auto": none, so that each layer's launch picks by its K / V formats)
        self.prefill_attention = {} if prefill_attention == "auto" else kernel
        # whether caches hold the 16-bit planes the "fa" prefill kernel reads 4-bit pages from (one
        # layer's 4-bit planes at 16 bits: ~13% of a 28-layer nvfp4 cache); "wg" decodes in its blocks
        self._scratch = kernel["mma_prefill"] == "fa"
        if prefill_chunk is not None and (prefill_chunk <= 0 or prefill_chunk % PAD_QUANTUM):
            raise ValueError(f"prefill_chunk must be a positive multiple of {PAD_QUANTUM}, got {prefill_chunk}")
        self.max_chunk = prefill_chunk or prefill_chunk_tokens(a, _sm_count(), kernel["mma_prefill"])
        self.prefill_chunk = self.max_chunk  # the Backend protocol's default tokens per prefill step
        self.stream = cuda.stream()
        # the GEMMs' 16-bit type: the checkpoint's own for fp16 ones (rounding fp16 weights to bf16
        # would lose 3 bits of each); bf16 for bf16 and fp32 checkpoints
        self.f16 = checkpoint_dtype(model_dir) == "F16"
        self.gemm = CublasGemm(self.stream, f16=self.f16)
        w = load_weights(model_dir, a, dtype="f16" if self.f16 else "bf16")
        self.embed = cuda.to_device(w.embed)  # [vocab, dim] 16-bit bits
        self.lm_head = self.embed if w.lm_head is w.embed else cuda.to_device(w.lm_head)
        self.norm = _f32(w.norm)
        self.layers = [DeviceLayer(
            attn_norm=_f32(lw.attn_norm), wqkv=cuda.to_device(lw.wqkv), bqkv=_f32(lw.bqkv),
            q_norm=_f32(lw.q_norm), k_norm=_f32(lw.k_norm), wo=cuda.to_device(lw.wo),
            bo=_f32(lw.bo) if lw.bo is not None else None, mlp_norm=_f32(lw.mlp_norm),
            w_gate_up=cuda.to_device(lw.w_gate_up), w_down=cuda.to_device(lw.w_down),
        ) for lw in w.layers]
        del w
        self.rope = Rope(a.rope, a.head_dim)
        self.sm_scale = float(a.head_dim) ** -0.5
        need, free = chunk_buffer_bytes(a, self.max_chunk), cuda.current_context().get_memory_info()[0]
        if need > free:  # a long --prefill-chunk; the default's buffers stay under CHUNK_BUFFER_BYTES
            raise PlanError(f"prefill passes of {self.max_chunk} tokens need {need / 2**30:.2f} GiB of GPU "
                            f"buffers, {free / 2**30:.2f} GiB is free after the weights; use a smaller --prefill-chunk")
        self._alloc_buffers()
        self._rope_rows = 0
        # captured passes over one KV arena (a cache's device memory), by (tokens, head, layers
        # still to calibrate). Graphs hold the arena's pool and table addresses: a new cache
        # replays them when it reuses the arena (new_cache), else it captures its own.
        self._arena: DeviceKVArena | None = None
        self._arena_user = lambda: None  # weak reference to the cache using self._arena
        self._graph_arena: DeviceKVArena | None = None
        self._graphs: dict[tuple, CapturedGraph] = {}
        self._sampler: Sampler | None = None  # whose rules and seed are in sample_params / sample_state
        self._compiled: set[tuple] = set()  # (T, head, KV formats) passes run once: no compile under capture

    # -- buffers ------------------------------------------------------------------------------------
    def _alloc_buffers(self) -> None:
        a, T = self.args, self.max_chunk
        hd, nq, nkv = a.head_dim, a.num_attention_heads, a.num_key_value_heads
        f32, u16, dev = np.float32, np.uint16, cuda.device_array
        self.x = dev((T, a.hidden_size), f32)  # residual stream
        self.h16 = dev((T, a.hidden_size), u16)  # normed rows: GEMM input
        self.o16 = dev((T, nq * hd), u16)  # attention output rows: o_proj input
        self.qkv = dev((T, (nq + 2 * nkv) * hd), u16)  # 16-bit GEMM outputs (layers.py, Dtypes)
        self.q = dev((T, nq, hd), f32)
        self.o = dev((T, nq, hd), f32)
        self.kv = dev((2, min(T, CALIB_TOKENS), nkv, hd), f32)  # a layer's first K/V: the 4-bit scales' amax
        self.kv_amax = dev((2, nkv, L.GSCALE_SLICES), f32)  # its maxima per token slice
        self.gu = dev((T, 2 * a.intermediate_size), u16)
        self.act16 = dev((T, a.intermediate_size), u16)
        self.logits = dev((1, a.vocab_size), f32)
        self.logits_all = None  # [T, vocab], made on the first all_logits call
        self.logits_host = cuda.pinned_array((1, a.vocab_size), f32)
        # a pass's inputs, read by its kernels (graph-safe): the chunk's (first position, valid tokens),
        # then its token ids, one buffer so that one copy uploads both
        self.io_host = cuda.pinned_array(2 + T, np.int32)
        self.io = dev(2 + T, np.int32)  # [2 + T]
        self.pos_host, self.tok_host = self.io_host[:2], self.io_host[2:]
        self.pos, self.tok = self.io[:2], self.io[2:]
        self.drawn = self.tok[:1]  # where the sample kernel writes the next token (made once: a numba
        # device slice costs the host microseconds every decode step)
        self.sample_params = dev(3, f32)  # temperature, top_k, top_p: numba_kernels/sampling.py
        self.sample_state = dev(2, np.int64)  # seed, step (the kernel advances step)
        # the drawn token's host copies: two, because decode_steps reads one while the next step's lands
        self.sample_host = cuda.pinned_array((2, 1), np.int32)
        # a decode step's fixed copies as one driver call each: numba's copy_to_device / copy_to_host
        # cost tens of microseconds of Python a call (H100, 512 tokens: 0.334 -> 0.325 ms a pipelined
        # step, bench/results/logs/generate_h100_74bf4c5.json)
        self._upload_pos = PinnedCopy(self.pos, self.pos_host, self.stream, to_device=True)
        self._download_drawn = [PinnedCopy(self.drawn, slot, self.stream, to_device=False) for slot in self.sample_host]
        self.ws_decode = AttentionWorkspace(DECODE_SPLITS, 1, nq, hd)
        self.ws_prefill = AttentionWorkspace(PREFILL_SPLITS, T, nq, hd)
        # a prompt's chunks as self.io's rows (first position, valid tokens, ids and padding), pinned
        # and on the device, grown to the longest prompt so far: a prefill allocates and frees
        # nothing (a numba-deferred cuMemFree flushed mid-prefill waits for the whole queue)
        self._prompt: tuple | None = None  # (host [n], dev [n]) int32
        # events recorded again and again instead of made per chunk / step: a dropped one joins
        # numba's deferred frees, whose flush (every 10 items) also frees any pending array
        self._events = deque(cuda.event(timing=False) for _ in range(4))
        self._staged = cuda.event(timing=False)

    def _ensure_rope(self, rows: int) -> None:
        """cos/sin [rows, hd/2] f32 on the device, the CPU backend's tables (float64 angles)."""
        if rows <= self._rope_rows:
            return
        cos, sin = self.rope.cos_sin(np.arange(rows))
        self.cos, self.sin = cuda.to_device(cos), cuda.to_device(sin)
        self._rope_rows = rows
        self._graph_arena = None  # captured graphs hold the old tables

    # -- Backend protocol ---------------------------------------------------------------------------
    def new_cache(self, table: KVTable, max_tokens: int) -> DevicePagedKVCache:
        """A cache for one sequence (capacity cache_tokens(max_tokens)). The device memory (and the
        graphs captured on it) of the last cache is reused when that cache is gone and had the same
        table and page count."""
        a, max_tokens = self.args, cache_tokens(max_tokens)
        self._ensure_rope(max_tokens)
        held, same = self._held_arena(table, max_tokens)
        reuse = held if same else None
        if held is not None and not same:
            self._arena = self._graph_arena = None  # free it before allocating another
            self._graphs = {}
        if reuse is not None:
            self.stream.synchronize()  # nothing queued may still read it
        cache = DevicePagedKVCache(table, a.num_key_value_heads, a.head_dim, max_tokens, self.page_tokens, reuse,
                                   self._scratch)
        self._arena, self._arena_user = cache.arena, weakref.ref(cache)
        return cache

    def _held_arena(self, table: KVTable, max_tokens: int) -> tuple[DeviceKVArena | None, bool]:
        """(the kept arena if its cache is gone, else None; whether a cache of this table and size
        can reuse it)."""
        held = self._arena if self._arena_user() is None else None
        a = self.args
        same = held is not None and held.key == arena_key(table, a.num_key_value_heads, a.head_dim, max_tokens,
                                                          self.page_tokens, self._scratch)
        return held, same

    def check_memory(self, table: KVTable, max_tokens: int) -> None:
        a, cap = self.args, cache_tokens(max_tokens)
        need = device_kv_nbytes(table, a.num_key_value_heads, a.head_dim, cap, self.page_tokens, self._scratch)
        free, total = cuda.current_context().get_memory_info()
        held, same = self._held_arena(table, cap)  # new_cache reuses or frees it
        if held is not None:
            need, free = (0, free) if same else (need, free + held.nbytes)
        need += max(0, cap - self._rope_rows) * a.head_dim * 4  # cos + sin tables
        if need > free:
            raise PlanError(
                f"{max_tokens} tokens of KV with table {table.name} need {need / 2**30:.2f} GiB of GPU "
                f"memory, {free / 2**30:.2f} GiB is free (of {total / 2**30:.1f}); try a smaller "
                "--kv-table (nvfp4), a shorter prompt or fewer --max-new-tokens"
            )

    def _check_tokens(self, tokens) -> np.ndarray:
        tokens = np.asarray(tokens, np.int64)
        if len(tokens) == 0:
            raise ValueError("forward needs at least one token")
        if tokens.min() < 0 or tokens.max() >= self.args.vocab_size:
            raise ValueError(f"token ids must be in 0..{self.args.vocab_size - 1}")
        return tokens

    def forward(self, tokens: np.ndarray, cache: DevicePagedKVCache, all_logits: bool = False) -> np.ndarray:
        """tokens [T] -> float32 logits [vocab] (last position) or [T, vocab]; appends their K/V."""
        tokens = self._check_tokens(tokens)
        step = LOGITS_CHUNK if all_logits else self.max_chunk
        if len(tokens) > step:  # split: each pass appends to the cache, so order is kept
            parts = [self.forward(tokens[i:i + step], cache, all_logits) for i in range(0, len(tokens), step)]
            return np.concatenate(parts) if all_logits else parts[-1]
        T = len(tokens)
        pos0 = self._stage(tokens, cache)
        s = self.stream
        if T == 1 and not all_logits and cache.calibrated.all():
            out = self._graphed_step(1, cache, "logits")
        else:
            out = self._step(T, pos0, cache, all_logits)
        host = np.empty(out.shape, np.float32) if all_logits else self.logits_host
        out.copy_to_host(host, stream=s)
        s.synchronize()
        return host if all_logits else host[0].copy()

    def prefill(self, tokens: np.ndarray, cache: DevicePagedKVCache, chunk: int | None = None,
                on_progress: Callable[[int], None] | None = None) -> np.ndarray:
        """A prompt -> float32 logits [vocab] after its last token. Chunks are enqueued back to back
        with at most two in flight, so the host enqueues chunk i+1 while the GPU runs chunk i (a
        forward() per chunk would wait for each); tokens and chunk positions are uploaded once, from
        pinned buffers kept for the next prompt, so no host staging buffer is rewritten under a
        pending copy. on_progress(tokens done)."""
        tokens = self._check_tokens(tokens)
        n, chunk = len(tokens), max(1, min(chunk or self.max_chunk, self.max_chunk))
        s = self.stream
        s.synchronize()  # idle but after an interrupted prefill, whose copies may still read the staging
        pos0 = cache.extend(n)
        cache.sync(s)
        starts = list(range(0, n, chunk))
        sizes = [min(chunk, n - st) for st in starts]  # tokens of each chunk
        rows = [min(padded_rows(T), chunk) for T in sizes]  # rows of each chunk's pass
        nc, width = len(starts), 2 + max(rows)
        host, dev = self._prompt_buffers(nc * width)
        host, dev = host[:nc * width].reshape(nc, width), dev[:nc * width].reshape(nc, width)  # [chunk, 2 + ids]
        for c, (st, T) in enumerate(zip(starts, sizes)):
            host[c, :2] = pos0 + st, T  # first position, valid tokens
            host[c, 2:2 + T], host[c, 2 + T:] = tokens[st:st + T], 0
        graphed = [R <= self.max_chunk and pos0 + st + R <= cache.capacity for st, R in zip(starts, rows)]
        # one graphed pass: its row goes straight into the graph's buffer, one copy before the first
        # kernel (kernels.md Prefill 0 (a))
        direct = nc == 1 and graphed[0]
        if not direct:
            dev.copy_to_device(host, stream=s)
        report = on_progress or (lambda done: None)
        done = []  # (event, tokens done when it fires)
        for c, (start, T, R) in enumerate(zip(starts, sizes, rows)):
            last = c == len(starts) - 1
            if graphed[c]:
                # R rows (T tokens, then padding): graph replay, ids and position copied in. The
                # padding's K/V land past the cache's length (pages it holds; unallocated ones
                # are skipped) and are overwritten by the next tokens; no valid row attends to them.
                self.io[:2 + R].copy_to_device((host if direct else dev)[c, :2 + R], stream=s)
                self._graphed_step(R, cache, None)
                out = self._head(T, False) if last else None
            else:  # a chunk whose padding would not fit (a cache made elsewhere): launched one by one
                out = self._step(T, pos0 + start, cache, False, tok=dev[c, 2:2 + T], pos=dev[c, :2],
                                 head="logits" if last else None)
            done.append((self._record(), start + T))
            if len(done) > 2:
                ev_old, n_old = done.pop(0)
                ev_old.synchronize()
                report(n_old)
        out.copy_to_host(self.logits_host, stream=s)
        s.synchronize()
        for _, n_done in done:
            report(n_done)
        return self.logits_host[0].copy()

    def _prompt_buffers(self, n: int) -> tuple:
        """The prompt staging buffers (pinned host, device), grown to a power of two >= n int32s.
        The caller has synchronized since their last use."""
        if self._prompt is None or n > len(self._prompt[0]):
            n = 1 << (n - 1).bit_length()
            self._prompt = (cuda.pinned_array(n, np.int32), cuda.device_array(n, np.int32))
        return self._prompt

    def _record(self):
        """An event recorded on the stream now, from a ring of four (a caller keeps at most three
        unwaited; on one stream, waiting on a later record of an event is a superset of the wait)."""
        ev = self._events[0]
        self._events.rotate(-1)
        ev.record(self.stream)
        return ev

    def decode(self, token: int, cache: DevicePagedKVCache, sampler: Sampler) -> int:
        """Append one token; -> the next, drawn on the GPU (numba_kernels/sampling.py: the host's
        rules, its own reproducible draws) inside the captured step, so 4 bytes come back instead
        of the logits. A new sampler (a new generate) uploads its rules and seed, step 0."""
        self._use_sampler(sampler)
        self._sample_step(self._stage([token], cache), cache)
        self._download_drawn[0]()
        self.stream.synchronize()
        return int(self.sample_host[0, 0])

    def decode_steps(self, token: int, cache: DevicePagedKVCache, sampler: Sampler,
                     max_steps: int) -> Iterator[int]:
        """decode() up to max_steps times from `token`, each step fed the token the one before drew,
        yielding each drawn token. The draw stays on the device (the sample kernel writes it into
        self.tok, the next step's input), so step t + 1 is enqueued before token t is read: the
        host's work of a step (staging, graph launch, the token's copy and the caller's use of it)
        overlaps the GPU's work of the one before. A caller that stops reading leaves one step that
        nobody asked for computed; closing the generator undoes it (its token leaves the cache, the
        sampler's draw counter steps back).
        Same tokens and cache as decode() in a loop (tests/test_cuda_backend.py)."""
        if not self.pipelined_decode:
            yield from sequential_decode_steps(self, token, cache, sampler, max_steps)
            return
        if max_steps <= 0:
            return
        s = self.stream
        self._use_sampler(sampler)
        pending: deque = deque()  # (event after the step's token copy, host slot of that token)
        drawn = consumed = 0  # steps whose sample kernel was launched / whose token was read
        base = cache.length  # an exception inside enqueue() may leave a step half done: undo by counts

        def enqueue() -> None:
            nonlocal drawn
            if drawn:  # the pinned table and position may change once their last copies ran
                self._staged.synchronize()
            pos0 = self._stage(None if drawn else [token], cache)  # later ids: drawn on the device
            self._staged.record(s)
            self._sample_step(pos0, cache)
            slot = self.sample_host[drawn % 2]
            self._download_drawn[drawn % 2]()
            drawn += 1
            pending.append((self._record(), slot))

        try:
            enqueue()
            while pending:
                if drawn < max_steps:
                    enqueue()
                done, slot = pending.popleft()
                done.synchronize()
                consumed += 1
                yield int(slot[0])
        finally:
            if cache.length > base + consumed:  # steps nobody read (a draw follows each extend): undone
                s.synchronize()
                cache.trim(cache.length - base - consumed)
                state = self.sample_state.copy_to_host()
                state[1] -= drawn - consumed  # the sampler's draw counter
                self.sample_state.copy_to_device(state)

    def _use_sampler(self, sampler: Sampler) -> None:
        """A new sampler (a new generate) uploads its rules and seed, step 0."""
        if self._sampler is not sampler:
            p, s = sampler.params, self.stream
            self.sample_params.copy_to_device(np.array([p.temperature, p.top_k, p.top_p], np.float32), stream=s)
            self.sample_state.copy_to_device(np.array([p.seed, 0], np.int64), stream=s)
            self._sampler = sampler

    def _sample_step(self, pos0: int, cache: DevicePagedKVCache) -> None:
        """Enqueue a pass over the staged token that draws the next one into self.tok[0]."""
        if cache.calibrated.all():
            self._graphed_step(1, cache, "sample")
        else:  # a cache whose prompt was empty
            self._step(1, pos0, cache, False, head="sample")

    def _stage(self, tokens, cache: DevicePagedKVCache) -> int:
        """Extend the cache by len(tokens) <= self.max_chunk and queue their ids (self.tok), first
        position (self.pos) and the block table for the device; -> that position. tokens None: one
        token whose id is already in self.tok[0] (the last decode step drew it there)."""
        T, s = 1 if tokens is None else len(tokens), self.stream
        pos0 = cache.extend(T)
        if tokens is not None:
            self.tok_host[:T] = tokens
        self.pos_host[:] = pos0, T
        cache.sync(s)
        if tokens is None:  # keep the drawn id in self.tok[0]
            self._upload_pos()
        else:
            self.io[:2 + T].copy_to_device(self.io_host[:2 + T], stream=s)
        return pos0

    def _graphed_step(self, T: int, cache: DevicePagedKVCache, head: str | None):
        """A pass over the T tokens in self.tok, first position in self.pos (device-position mode,
        so one capture serves every decode step / every full prefill chunk). The first such pass
        of this backend (T, head, KV formats) runs eagerly, because it compiles kernel variants;
        after that a cache captures the pass on first use and replays it. -> the logits buffer,
        or None."""
        if self._graph_arena is not cache.arena:
            self._graph_arena, self._graphs = cache.arena, {}
        calib = tuple(cache.calibrated)  # a pass over uncalibrated layers also fixes their scales
        key = (T, head, calib)
        compiled = (T, head, calib, tuple(cache.table.layers))
        if not self.graphs or compiled not in self._compiled:
            self._compiled.add(compiled)
            return self._step(T, None, cache, False, head=head)
        if key not in self._graphs:
            self._graphs[key] = CapturedGraph(self.stream, lambda: self._step(T, None, cache, False, head=head))
        self._graphs[key].launch()
        cache.calibrated[:] = True  # what the captured pass did to uncalibrated layers
        return self.logits if head else None

    # -- the pass -----------------------------------------------------------------------------------
    def _step(self, T: int, pos0: int | None, cache: DevicePagedKVCache, all_logits: bool, tok=None, pos=None,
              head: str | None = "logits"):
        """Enqueue one pass over T rows: ids in `tok` [T] (default self.tok), (first position, valid
        tokens <= T) in `pos` [2] (default self.pos) on the device and pos0 on the host. pos0 None:
        a captured decode step, where attention reads the position from the device and plans its
        splits for the cache's whole length. head: "logits" (final norm + LM head), "sample" (and draw the next
        token into self.tok[0], where the next decode step reads it), None (a prompt chunk before the last)."""
        a, s, gemm = self.args, self.stream, self.gemm
        tok = self.tok[:T] if tok is None else tok
        pos = self.pos if pos is None else pos
        eps = a.rms_norm_eps
        x, h, qkv, q, o, o16 = self.x[:T], self.h16[:T], self.qkv[:T], self.q[:T], self.o[:T], self.o16[:T]
        f16 = self.f16
        L.launch_embed(tok, self.embed, x, s, f16=f16)
        ws = self.ws_decode if T == 1 else self.ws_prefill
        for i, lw in enumerate(self.layers):
            kp, vp = cache.pools[i]
            table, gscale = cache.table_dev[i], cache.gscale_dev[i]
            L.launch_rms_norm(x, lw.attn_norm, eps, h, s, f16=f16)
            gemm(h, lw.wqkv, qkv)
            def post_qkv(rows: int, write_pages: bool) -> None:
                L.launch_qkv_rope_append(
                    qkv[:rows], lw.bqkv, lw.q_norm, lw.k_norm, self.cos, self.sin, pos, eps, q[:rows], self.kv,
                    (kp.fmt_id, table[0], kp.codes, kp.scales), (vp.fmt_id, table[1], vp.codes, vp.scales),
                    gscale, write_pages, s, f16=f16)

            if not cache.calibrated[i]:  # the layer's first chunk: fp32 K/V fix the 4-bit scales first
                rows = min(T, self.kv.shape[1])  # its first CALIB_TOKENS
                post_qkv(rows, False)
                L.launch_kv_gscale(self.kv, pos, cache.two_level_dev[i], gscale, self.kv_amax, s)
                cache.calibrated[i] = True
            post_qkv(T, True)
            # graphs plan attention for the arena's capacity: every cache that replays them fits it
            at, plan_len = (pos, cache.capacity) if pos0 is None else (pos0, None)
            paged_attention_cuda(q, o, at, self.sm_scale, kp.fmt_id, kp.codes, kp.scales, vp.fmt_id, vp.codes,
                                 vp.scales, gscale, table, ws, stream=s, check_cold=False, plan_len=plan_len,
                                 **(self.prefill_attention if T > 1 else {}),
                                 prefill_scratch=cache.arena.prefill_scratch if T > 1 else None,
                                 out16=o16.reshape(o.shape), out16_fp16=f16)  # o_proj's 16-bit input
            gemm(o16, lw.wo, x, accumulate=True)
            if lw.bo is not None:
                L.launch_add_bias(x, lw.bo, s)
            L.launch_rms_norm(x, lw.mlp_norm, eps, h, s, f16=f16)
            gemm(h, lw.w_gate_up, self.gu[:T])
            L.launch_swiglu(self.gu[:T], self.act16[:T], s, f16=f16)
            gemm(self.act16[:T], lw.w_down, x, accumulate=True)
        if head is None:
            return None
        out = self._head(T, all_logits)
        if head == "sample":
            launch_sample(out[0], self.sample_params, self.sample_state, self.drawn, s)
        return out

    def _head(self, T: int, all_logits: bool):
        """Final norm + LM head over the last pass's rows in self.x: -> logits [1 or T, vocab]."""
        a, s, eps = self.args, self.stream, self.args.rms_norm_eps
        x, h = self.x[:T], self.h16[:T]
        if all_logits:
            if self.logits_all is None:
                self.logits_all = cuda.device_array((LOGITS_CHUNK, a.vocab_size), np.float32)
            rows, out = x, self.logits_all[:T]
        else:
            rows, out = x[T - 1:T], self.logits
        L.launch_rms_norm(rows, self.norm, eps, h[:rows.shape[0]], s, f16=self.f16)
        self.gemm(h[:rows.shape[0]], self.lm_head, out)
        return out
