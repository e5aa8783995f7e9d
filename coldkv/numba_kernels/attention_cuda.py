"""CUDA GQA attention over the paged, mixed-format KV cache (decode and chunked causal prefill).

One kernel serves both: query token t of a chunk of T tokens sits at position pos0 + t and sees
the cached keys 0..pos0 + t (decode is T = 1). The work is split flash-decoding style:

  grid (T, n_blocks, kv_heads), 4 warps per block. Warp w of block b owns a contiguous run of
  `ppw` pages of the sequence (split index b * 4 + w) and keeps its own online softmax (running
  max m, per-lane sums l, accumulator acc) for ALL the q heads of its kv group: every K/V page is
  read once per kv head, not once per q head. Each warp writes its partial (m, l, acc) to a
  preallocated workspace; `_reduce_kernel` merges the partials of every (t, q head) row.

Inside a warp, 32-token chunks of a page go through three phases:
  K   lanes are (token, column) pairs: LPT_K lanes per token, each owning E_K values of the row as
      W_K 32-bit code words, interleaved across lanes (lane c reads words c, c + LPT_K, ..) so a
      warp load covers whole 32-byte sectors. The lane decodes its words in registers (bf16:
      shift; int8: magic-number float; E2M1/ISO3: 16-entry table in shared memory; E4M3 group
      scales: 256-entry table in shared memory) and dots them with the q values it holds in
      registers (pre-scaled by sm_scale * log2 e), one partial per q head; a shfl_xor butterfly
      over the LPT_K lanes sums the partials. Group/row scales are applied once per word/row.
  softmax  lane l owns token l of the chunk: a warp max per q head, lazy rescaling (the running
      max moves only when the chunk max exceeds it by more than 2^8 = `_LAZY` in log2 units, so
      the O(G * E) accumulator rescale is rare; exact, as the final division uses the same max),
      p = exp2(s - m) goes to shared memory.
  V   lanes are (token, column) pairs again (LPT_V lanes per token, formats of K and V may
      differ), acc[g, dims] += p[g, token] * scale * value, decoded in registers.
Nothing is dequantized to global memory. Scores and softmax run in float32.

Block table entries: >= 0 hot page, -1 unallocated (never read), <= -2 a cold slot: NOT YET
SUPPORTED here; such a page is skipped (contributes nothing) until the rANS device decoder
plugs in. `paged_attention_cuda` refuses a table with cold entries in the attended range when
it is given a host table (check_cold=True), so a skip never happens silently from the host API.

Kernels are specialised per (K format, V format, group size G, head_dim D) by `_build` (the
closure constants size the register arrays and fix the lane layout); `get_kernel` caches them.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from coldkv.numba_kernels.jit_cache import cuda_kernel
from coldkv.numba_kernels.launch import has_dependent_launch, launch_dependent
from coldkv.numba_kernels.mma_ptx import griddep_wait
from coldkv.numba_kernels.fp import bf16_enc, bits_f32, f16_enc
from coldkv.numba_kernels.quant import BF16, INT8, ISO3, NVFP4, ref_e4m3_decode

__all__ = ["SUPPORTED_FORMATS", "AttentionWorkspace", "paged_attention_cuda", "plan_splits",
           "lane_layout", "get_kernel", "PTX_SIGNATURES", "PTX_SIGNATURES_MORE"]

SUPPORTED_FORMATS = (BF16, INT8, NVFP4, ISO3)
NWARPS = 4  # warps per block; each warp is one split
THREADS = 32 * NWARPS
CHUNK = 32  # tokens per softmax step (one per lane)
_LAZY = np.float32(8.0)  # log2 units: rescale only when the max grows by more than this
_NEG_INF = np.float32(-np.inf)
_LOG2E = 1.4426950408889634
_VPW = {BF16: 2, INT8: 4, NVFP4: 8, ISO3: 8}  # values per 32-bit code word


def _SCALE_COLS(fmt: int, D: int) -> int:
    return {BF16: 0, INT8: 1, NVFP4: D // 16, ISO3: D // 16}[fmt]

# 16-entry value tables of the 4-bit formats (sign in bit 3) and the 256-entry E4M3 table.
_E2M1_TAB = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
_ISO3_TAB = np.array([0, 1, 2, 3, 4, 5, 6, 7, -0.0, -1, -2, -3, -4, -5, -6, -7], np.float32)
_E4M3_TAB = ref_e4m3_decode(np.arange(256, dtype=np.uint8)).astype(np.float32)


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def lane_layout(fmt: int, G: int, D: int, plane: str = "k", shrink: int = 0):
    """(E values per lane per token, LPT lanes per token, W code words per lane, VPW values per word).

    q (G * E_K floats) and acc (G * E_V) live in registers. K lanes sum their partial dots with a
    log2(LPT_K)-step butterfly per token, so K wants many values per lane (E_K = 64 // G); the V
    phase has no per-token reduction, so E_V is half that (fewer registers, same FMAs). At most
    32 lanes per token, at least one code word per lane. `shrink` halves E (smaller chunks)."""
    vpw = _VPW[fmt]
    budget = (64 if plane == "k" else 32) >> shrink
    e = min(D, max(_pow2_floor(budget // G) if G <= budget else 1, D // 32, vpw))
    return e, D // e, e // vpw, vpw


_STAGE_BYTES = 6144  # per warp: code words + decoded scales of one chunk, K and V
_SMEM_LIMIT = 40 * 1024


def chunk_layout(kf: int, vf: int, G: int, D: int):
    """(lane layout K, lane layout V, CH tokens per chunk): a chunk of CH rows of K and V is staged
    in the warp's shared memory; CH >= the tokens one lane step covers, <= 32 (one per lane)."""
    for shrink in range(4):
        lk, lv = lane_layout(kf, G, D, "k", shrink), lane_layout(vf, G, D, "v", shrink)
        per_tok = 4 * (D // lk[3] + D // lv[3] + _SCALE_COLS(kf, D) + _SCALE_COLS(vf, D))
        ch = min(32, max(32 // lk[1], 32 // lv[1], _pow2_floor(_STAGE_BYTES // per_tok)))
        if NWARPS * ch * per_tok <= _SMEM_LIMIT or shrink == 3:
            return lk, lv, ch
    raise AssertionError


def _table16(fmt):
    return _ISO3_TAB if fmt == ISO3 else _E2M1_TAB


@cuda.jit(device=True, inline=True)
def _pos_int(pos):
    return pos


@cuda.jit(device=True, inline=True)
def _pos_dev(pos):
    return pos[0]


def _build(kf: int, vf: int, G: int, D: int, max_registers=None, devpos=False):
    """The attention kernel for K format kf, V format vf, G q heads per kv head, head_dim D;
    `devpos`: the position argument is a 1-D int32 device array (position at [0]) instead of an int."""
    _read_pos = _pos_dev if devpos else _pos_int
    (EK, LPT_K, WK, VPWK), (EV, LPT_V, WV, VPWV), CH = chunk_layout(kf, G=G, D=D, vf=vf)
    TPW_K, TPW_V = 32 // LPT_K, 32 // LPT_V
    NSK, NSV = CH // TPW_K, CH // TPW_V  # lane steps per chunk
    RWK, RWV = D // VPWK, D // VPWV  # 32-bit code words per row
    SCK, SCV = _SCALE_COLS(kf, D), _SCALE_COLS(vf, D)  # scale entries per row
    NLK, NLV = CH * RWK // 32, CH * RWV // 32  # staged words per lane
    assert NLK * 32 == CH * RWK and NLV * 32 == CH * RWV, (kf, vf, G, D, CH)
    NSCK, NSCV = -(-CH * SCK // 32), -(-CH * SCV // 32)  # staged scales per lane
    NSCK1, NSCV1 = max(1, NSCK), max(1, NSCV)
    SKW, SVW = CH * RWK, CH * RWV
    SKS, SVS = max(1, CH * SCK), max(1, CH * SCV)
    K4 = kf in (NVFP4, ISO3)
    V4 = vf in (NVFP4, ISO3)
    KTAB = _table16(kf)
    VTAB = _table16(vf)
    E4TAB = _E4M3_TAB
    f32 = np.float32
    u64 = np.uint64

    jit = cuda_kernel(max_registers=max_registers)

    @jit
    def attn_kernel(q, pos, qscale, P, k_words, k_scales, v_words, v_scales, gscale, table,
                    ws_acc, ws_ml):
        # pos: position of query 0, an int or (device-position mode) a 1-D int32 device array whose [0] is read
        # here, so a captured CUDA graph serves every decode position.
        # k_words/v_words: the pools' codes as flat uint32 words, row r of page pg at (pg * P + r) * RW;
        # k_scales/v_scales: the pools' scales, flat (uint8 E4M3 bytes or float32 int8 row scales).
        # Global indices are cast to uint64 so numba emits no negative-index wraparound code.
        pos0 = _read_pos(pos)
        t = cuda.blockIdx.x
        blk = cuda.blockIdx.y
        h = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        split = blk * NWARPS + warp

        lutk = cuda.shared.array(16, np.float32)
        lutv = cuda.shared.array(16, np.float32)
        e4 = cuda.shared.array(256, np.float32)
        sbuf = cuda.shared.array((NWARPS, G, 32), np.float32)
        skw = cuda.shared.array((NWARPS, SKW), np.uint32)  # staged chunk: K code words
        svw = cuda.shared.array((NWARPS, SVW), np.uint32)
        sks = cuda.shared.array((NWARPS, SKS), np.float32)  # staged, decoded scales (step s/g)
        svs = cuda.shared.array((NWARPS, SVS), np.float32)
        if tid < 16:
            lutk[tid] = KTAB[tid]
            lutv[tid] = VTAB[tid]
        for i in range(tid, 256, THREADS):
            e4[i] = E4TAB[i]
        cuda.syncthreads()

        L = pos0 + t + 1  # keys this query sees
        npages = (L + P - 1) // P
        # pages per split from the launch's length (pos0 + T) and grid: the host planned the grid
        # for some maximum length, the device position may be anything; splits past the end
        # write an empty partial (m = -inf, l = 0) that the reduction skips.
        nsplit = cuda.gridDim.y * NWARPS
        ppw = ((pos0 + cuda.gridDim.x + P - 1) // P + nsplit - 1) // nsplit
        p_begin = split * ppw
        p_end = min(p_begin + ppw, npages)

        ck = lane % LPT_K
        tk = lane // LPT_K
        cv = lane % LPT_V
        tv = lane // LPT_V
        hq0 = h * G

        qr = cuda.local.array((G, WK, VPWK), np.float32)
        for g in range(G):
            for k in range(WK):
                col = (ck + LPT_K * k) * VPWK
                for i in range(VPWK):
                    qr[g, k, i] = q[t, hq0 + g, col + i] * qscale
        acc = cuda.local.array((G, WV, VPWV), np.float32)
        for g in range(G):
            for k in range(WV):
                for i in range(VPWV):
                    acc[g, k, i] = f32(0.0)
        m_run = cuda.local.array(G, np.float32)
        l_run = cuda.local.array(G, np.float32)
        for g in range(G):
            m_run[g] = _NEG_INF
            l_run[g] = f32(0.0)
        dots = cuda.local.array(G, np.float32)
        prob = cuda.local.array(G, np.float32)
        kv = cuda.local.array(VPWK, np.float32)
        vv = cuda.local.array(VPWV, np.float32)
        inv_gk = f32(1.0) / gscale[0, h]
        inv_gv = f32(1.0) / gscale[1, h]
        stk = cuda.local.array(NLK, np.uint32)  # staging registers
        stv = cuda.local.array(NLV, np.uint32)
        kss = cuda.local.array(NSCK1, np.uint8)
        vss = cuda.local.array(NSCV1, np.uint8)
        ksr = f32(0.0)
        vsr = f32(0.0)

        for p in range(p_begin, p_end):
            pk = table[0, h, p]
            pv = table[1, h, p]
            if pk < 0 or pv < 0:
                continue  # -1: unallocated; <= -2: cold slot (not decoded here yet)
            nval = min(P, L - p * P)
            for c0 in range(0, nval, CH):
                n = min(CH, nval - c0)
                # ---------------- stage the chunk's rows (contiguous in the pools), coalesced.
                # All loads first (into registers, branch-free: a partial chunk re-reads its last
                # row, never read later), then the shared stores: every word of the chunk is in
                # flight at once instead of one load -> store round trip per word.
                rk0 = pk * P + c0
                rv0 = pv * P + c0
                bk = rk0 * RWK
                bv = rv0 * RWV
                lastk = n * RWK - 1
                lastv = n * RWV - 1
                for j in range(NLK):
                    stk[j] = k_words[u64(bk + min(lane + 32 * j, lastk))]
                for j in range(NLV):
                    stv[j] = v_words[u64(bv + min(lane + 32 * j, lastv))]
                if kf == 1:
                    ksr = k_scales[u64(rk0 + min(lane, n - 1))]
                elif K4:
                    for j in range(NSCK):
                        kss[j] = k_scales[u64(rk0 * SCK + min(lane + 32 * j, n * SCK - 1))]
                if vf == 1:
                    vsr = v_scales[u64(rv0 + min(lane, n - 1))]
                elif V4:
                    for j in range(NSCV):
                        vss[j] = v_scales[u64(rv0 * SCV + min(lane + 32 * j, n * SCV - 1))]
                for j in range(NLK):
                    skw[warp, lane + 32 * j] = stk[j]
                for j in range(NLV):
                    svw[warp, lane + 32 * j] = stv[j]
                if kf == 1:
                    if lane < CH:
                        sks[warp, lane] = ksr
                elif K4:
                    for j in range(NSCK):
                        if lane + 32 * j < CH * SCK:
                            sks[warp, lane + 32 * j] = e4[kss[j]] * inv_gk
                if vf == 1:
                    if lane < CH:
                        svs[warp, lane] = vsr
                elif V4:
                    for j in range(NSCV):
                        if lane + 32 * j < CH * SCV:
                            svs[warp, lane + 32 * j] = e4[vss[j]] * inv_gv
                cuda.syncwarp()
                # ---------------- K: scores of the chunk's tokens for the G q heads
                for s in range(NSK):
                    tok = s * TPW_K + tk
                    for g in range(G):
                        dots[g] = f32(0.0)
                    if tok < n:
                        for k in range(WK):
                            wi = ck + LPT_K * k
                            w = skw[warp, tok * RWK + wi]
                            if kf == 0:  # bf16
                                kv[0] = bits_f32((w & 0xFFFF) << 16)
                                kv[1] = bits_f32(w & 0xFFFF0000)
                            elif kf == 1:  # int8: 0x4B000000 | (byte ^ 0x80) is 2^23 + 128 + code
                                for i in range(VPWK):
                                    kv[i] = bits_f32(((w >> (8 * i)) & 0xFF) ^ 0x4B000080) - f32(8388736.0)
                            else:
                                for i in range(VPWK):
                                    kv[i] = lutk[(w >> (4 * i)) & 15]
                            if K4:
                                d = sks[warp, tok * SCK + (wi >> 1)]
                                for g in range(G):
                                    part = f32(0.0)
                                    for i in range(VPWK):
                                        part += qr[g, k, i] * kv[i]
                                    dots[g] += part * d
                            else:
                                for g in range(G):
                                    part = dots[g]
                                    for i in range(VPWK):
                                        part += qr[g, k, i] * kv[i]
                                    dots[g] = part
                        if kf == 1:
                            rs = sks[warp, tok]
                            for g in range(G):
                                dots[g] *= rs
                    for g in range(G):  # butterfly over the LPT_K lanes of a token
                        x = dots[g]
                        off = 1
                        while off < LPT_K:
                            x += cuda.shfl_xor_sync(0xFFFFFFFF, x, off)
                            off *= 2
                        if ck == 0:
                            sbuf[warp, g, tok] = x if tok < n else _NEG_INF
                cuda.syncwarp()
                # ---------------- softmax step: lane owns token `lane` of the chunk
                for g in range(G):
                    sc = sbuf[warp, g, lane] if lane < CH else _NEG_INF
                    mx = sc
                    off = 1
                    while off < 32:
                        mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, off))
                        off *= 2
                    mo = m_run[g]
                    if mx > mo + _LAZY:  # warp-uniform
                        alpha = math.exp2(mo - mx)
                        l_run[g] *= alpha
                        for k in range(WV):
                            for i in range(VPWV):
                                acc[g, k, i] *= alpha
                        m_run[g] = mx
                    pr = math.exp2(sc - m_run[g])
                    l_run[g] += pr
                    if lane < CH:
                        sbuf[warp, g, lane] = pr
                cuda.syncwarp()
                # ---------------- V: acc += p * v
                for s in range(NSV):
                    tok = s * TPW_V + tv
                    if tok < n:
                        for g in range(G):
                            prob[g] = sbuf[warp, g, tok]
                        if vf == 1:
                            rs = svs[warp, tok]
                            for g in range(G):
                                prob[g] *= rs
                        for k in range(WV):
                            wi = cv + LPT_V * k
                            w = svw[warp, tok * RWV + wi]
                            if vf == 0:
                                vv[0] = bits_f32((w & 0xFFFF) << 16)
                                vv[1] = bits_f32(w & 0xFFFF0000)
                            elif vf == 1:
                                for i in range(VPWV):
                                    vv[i] = bits_f32(((w >> (8 * i)) & 0xFF) ^ 0x4B000080) - f32(8388736.0)
                            else:
                                for i in range(VPWV):
                                    vv[i] = lutv[(w >> (4 * i)) & 15]
                            if V4:
                                d = svs[warp, tok * SCV + (wi >> 1)]
                                for g in range(G):
                                    pd = prob[g] * d
                                    for i in range(VPWV):
                                        acc[g, k, i] += pd * vv[i]
                            else:
                                for g in range(G):
                                    pd = prob[g]
                                    for i in range(VPWV):
                                        acc[g, k, i] += pd * vv[i]
                cuda.syncwarp()

        # ---------------- the warp's partial: (m, l, acc) per q head
        for g in range(G):
            x = l_run[g]
            off = 1
            while off < 32:
                x += cuda.shfl_xor_sync(0xFFFFFFFF, x, off)
                off *= 2
            l_run[g] = x
            for k in range(WV):
                for i in range(VPWV):
                    a = acc[g, k, i]
                    off = LPT_V
                    while off < 32:
                        a += cuda.shfl_xor_sync(0xFFFFFFFF, a, off)
                        off *= 2
                    acc[g, k, i] = a
        if tv == 0:
            for g in range(G):
                for k in range(WV):
                    col = (cv + LPT_V * k) * VPWV
                    for i in range(VPWV):
                        ws_acc[split, t, hq0 + g, col + i] = acc[g, k, i]
        if lane == 0:
            for g in range(G):
                ws_ml[split, t, hq0 + g, 0] = m_run[g]
                ws_ml[split, t, hq0 + g, 1] = l_run[g]

    return attn_kernel


RED_WARPS = 16  # at most (decode rows)
_RED_UNROLL = 4
_MAX_DW = 8  # head_dim <= 256: at most 8 dims per lane


# what the reduce kernels also write: nothing, or out16 [T, Hq, D] u16 = the output rounded to bf16 / fp16
# (the o_proj GEMM's input: a decode step then has no round16 launch a layer)
TO16_NONE, TO16_BF16, TO16_FP16 = 0, 1, 2


def _enc16(to16: int):
    return f16_enc if to16 == TO16_FP16 else bf16_enc


def _to16_args(out, out16, out16_fp16: bool, write: bool = True) -> tuple:
    """(to16, the kernel's out16 argument): what a kernel writes besides `out`, and the array it
    writes there (`out`'s bits when nothing: an unused argument of the right type)."""
    to16 = TO16_NONE if out16 is None or not write else TO16_FP16 if out16_fp16 else TO16_BF16
    return to16, out.view(np.uint16) if out16 is None else out16


@functools.lru_cache(maxsize=None)
def _reduce_kernel(to16: int = TO16_NONE, pdl: bool = False):
    """out[t, hq, :] = merge of the n_splits partials (m in log2 units, l, acc) of row (t, hq).

    Grid (T * Hq, D // 32): a block per (row, 32-dim slice), lane = dim. Warp w merges splits
    w, w + warps, .. relative to its own running max, _RED_UNROLL splits' loads issued before any
    is used, then warp 0 merges the warps' sums relative to the row max: one round of loads
    (a decode step's 64 splits are one), not a round for the row max and another for the sums
    as until session 29. (Earlier versions: one thread per dim over all splits cost 100-400 us
    at 256-512 splits; a block per row with an online max per warp over all splits was a chain
    of dependent L2 round trips on 32 blocks at decode, see docs/kernels_log.md, "Decode, session 12".)
    Trailing empty splits (m = -inf, acc unwritten) leave every sum bitwise as it was: a warp's
    max does not move, so nothing is rescaled, and they add exact zeros."""
    enc = _enc16(to16)
    IX, U32 = np.uint64, np.uint32

    @cuda_kernel
    def reduce(ws_acc, ws_ml, n_splits, out, out16):
        # 32-bit unsigned block arithmetic and array indices: the kernel is issue-bound on its
        # index math (ncu, session 29: 1168 SASS instructions, 335 IMADs, with Python's int64, the
        # negative-index selects and a 64-bit division for range()'s runtime step; 848 this way)
        if pdl:  # a dependent launch: the partials are complete and visible after this
            griddep_wait()
        D = U32(out.shape[2])
        Hq = U32(out.shape[1])
        r = U32(cuda.blockIdx.x)
        t = IX(r // Hq)
        hq = IX(r % Hq)
        tid = U32(cuda.threadIdx.x)
        w = tid >> U32(5)
        lane = tid & U32(31)
        nw = U32(cuda.blockDim.x) >> U32(5)  # _reduce: from the rows, never from n_splits
        d = (U32(cuda.blockIdx.y) << U32(5)) + lane
        dd = IX(min(d, D - U32(1)))
        sm_m = cuda.shared.array(RED_WARPS, np.float32)
        sm_num = cuda.shared.array((RED_WARPS, 32), np.float32)
        sm_den = cuda.shared.array(RED_WARPS, np.float32)
        mw = _NEG_INF  # the warp's running max (one per split: the whole warp agrees)
        num = np.float32(0.0)
        den = np.float32(0.0)
        ns = U32(n_splits)
        last = ns - U32(1)
        rm = cuda.local.array(_RED_UNROLL, np.float32)  # constant indices after unrolling: registers
        rl = cuda.local.array(_RED_UNROLL, np.float32)
        ra = cuda.local.array(_RED_UNROLL, np.float32)
        s0 = w
        while s0 < ns:
            for u in range(_RED_UNROLL):  # all loads first, straight-line: U splits in flight
                sc = IX(min(s0 + U32(u) * nw, last))
                rm[u] = ws_ml[sc, t, hq, IX(0)]
                rl[u] = ws_ml[sc, t, hq, IX(1)]
                ra[u] = ws_acc[sc, t, hq, dd]
            mn = mw
            for u in range(_RED_UNROLL):
                if s0 + U32(u) * nw <= last:
                    mn = max(mn, rm[u])
            if mn > mw:  # the max moved: rescale what the warp has (mw = -inf: 0 times zero sums)
                c = math.exp2(mw - mn)
                num *= c
                den *= c
                mw = mn
            for u in range(_RED_UNROLL):
                # selects, not branches; -inf: an empty split (its acc may be unwritten)
                ok = s0 + U32(u) * nw <= last and rm[u] > _NEG_INF
                wt = math.exp2(rm[u] - mw) if ok else np.float32(0.0)
                den += wt * rl[u] if ok else np.float32(0.0)
                num += wt * ra[u] if ok else np.float32(0.0)
            s0 += nw * U32(_RED_UNROLL)
        sm_num[w, lane] = num
        if lane == 0:
            sm_m[w] = mw
            sm_den[w] = den
        cuda.syncthreads()
        if w == 0 and d < D:
            mg = _NEG_INF
            for w2 in range(nw):
                mg = max(mg, sm_m[w2])
            nsum = np.float32(0.0)
            dsum = np.float32(0.0)
            for w2 in range(nw):
                m2 = sm_m[w2]
                if m2 > _NEG_INF:  # a warp of empty splits only has no sums
                    c = math.exp2(m2 - mg)
                    nsum += c * sm_num[w2, lane]
                    dsum += c * sm_den[w2]
            v = nsum / dsum
            out[t, hq, IX(d)] = v
            if to16:
                out16[t, hq, IX(d)] = enc(v)

    return reduce


@functools.lru_cache(maxsize=None)
def _reduce_rows_kernel(to16: int = TO16_NONE, pdl: bool = False):
    """Prefill chunks (many rows, few splits): a warp per row (t, hq), lane = dims lane, lane + 32,
    ..; the splits in order, no shared memory or barrier. The block-per-(row, 32 dims) kernel above
    spent ~70 us on a 2048-token chunk (32768 blocks of 2 warps, each a few loads between two
    barriers); this one reads the 20 MB in ~10 us. Empty splits (m = -inf, acc unwritten) are
    skipped, so trailing ones change nothing, bitwise."""
    enc = _enc16(to16)

    @cuda_kernel
    def reduce_rows(ws_acc, ws_ml, n_splits, out, out16):
        if pdl:
            griddep_wait()
        T, Hq, D = out.shape
        row = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
        lane = cuda.threadIdx.x % 32
        if row >= T * Hq:
            return
        t = row // Hq
        hq = row % Hq
        M = _NEG_INF
        for s in range(n_splits):
            M = max(M, ws_ml[s, t, hq, 0])
        num = cuda.local.array(_MAX_DW, np.float32)  # constant indices after unrolling: registers
        for j in range(_MAX_DW):
            num[j] = np.float32(0.0)
        den = np.float32(0.0)
        for s in range(n_splits):
            m = ws_ml[s, t, hq, 0]
            if m > _NEG_INF:  # the whole warp agrees: one row
                wt = math.exp2(m - M)
                den += wt * ws_ml[s, t, hq, 1]
                for j in range(_MAX_DW):
                    if 32 * j < D:
                        num[j] += wt * ws_acc[s, t, hq, lane + 32 * j]
        for j in range(_MAX_DW):
            if 32 * j < D:
                v = num[j] / den
                out[t, hq, lane + 32 * j] = v
                if to16:
                    out16[t, hq, lane + 32 * j] = enc(v)

    return reduce_rows


_RED_ROWS_WARPS = 8


_SIM_MAX_WARPS = 1  # the simulator runs a Python thread per GPU thread: the same kernel, fewer warps


def _reduce(ws_acc, ws_ml, splits, out, stream, out16=None, out16_fp16=False, pdl=False):
    """Merge the splits into out (and, given out16 [T, Hq, D] u16, the same rounded to bf16, or
    fp16 with out16_fp16). pdl: a programmatic dependent launch (launch.launch_dependent) that
    waits in the kernel for the attention kernel before it, which must trigger it.

    The kernel and its block size follow from the rows only, never from the split count: a launch
    planned for a longer cache (device-position / capacity planning) adds empty splits, which then
    add exact zeros in the same order, so its result is bitwise that of a launch planned for the
    actual length (the backend's captured prefill == its per-chunk forward)."""
    from numba import config

    T, Hq, D = out.shape
    to16, o16 = _to16_args(out, out16, out16_fp16)
    if T * Hq > 256:  # prefill chunks: a warp per row
        kern, grid, block = _reduce_rows_kernel(to16, pdl), -(-T * Hq // _RED_ROWS_WARPS), 32 * _RED_ROWS_WARPS
    else:  # decode rows
        warps = min(RED_WARPS, _SIM_MAX_WARPS) if config.ENABLE_CUDASIM else RED_WARPS
        kern, grid, block = _reduce_kernel(to16, pdl), (T * Hq, -(-D // 32)), 32 * warps
    if pdl:
        launch_dependent(kern, grid, block, stream, ws_acc, ws_ml, splits, out, o16)
    else:
        kern[grid, block, stream](ws_acc, ws_ml, splits, out, o16)


_KERNELS: dict = {}


def get_kernel(kf: int, vf: int, G: int, D: int, max_registers=None, devpos=False):
    key = (int(kf), int(vf), int(G), int(D), max_registers, bool(devpos))
    if key not in _KERNELS:
        if kf not in SUPPORTED_FORMATS or vf not in SUPPORTED_FORMATS:
            raise ValueError(f"attention_cuda: hot formats are bf16/int8/nvfp4/iso3, got K={kf} V={vf}")
        if D % 64:
            raise ValueError(f"attention_cuda: head_dim must be a multiple of 64, got {D}")
        _KERNELS[key] = _build(*key)
    return _KERNELS[key]


# ==================================================================================== host side
def _sm_count() -> int:
    try:
        return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    except Exception:  # the simulator
        return 4


@functools.cache
def _dram_tbps() -> float:
    """The current GPU's peak DRAM bandwidth in TB/s (double data rate x bus width); 0.0 where the
    driver does not say (the simulator), which keeps the rules tuned on the H100."""
    try:
        dev = cuda.get_current_device()
        return 2e3 * int(dev.MEMORY_CLOCK_RATE) * int(dev.GLOBAL_MEMORY_BUS_WIDTH) / 8 / 1e12
    except Exception:
        return 0.0


def plan_splits(T: int, H: int, L_max: int, P: int, n_sm: int, max_splits: int, resident: int = 0):
    """(pages per warp, blocks per (t, kv head)): about 16 warps per SM over the whole grid, or,
    given `resident` (blocks of the kernel that fit on the GPU at once), at most one such wave:
    a grid of 1.3 waves costs two."""
    npages = max(1, -(-L_max // P))
    if resident:
        want_blocks = max(1, resident // (T * H))
    else:
        want_blocks = max(1, -(-(n_sm * 16) // (NWARPS * T * H)))
    want_blocks = min(want_blocks, max(1, max_splits // NWARPS))
    ppw = max(1, -(-npages // (want_blocks * NWARPS)))
    nwarps = -(-npages // ppw)
    return ppw, -(-nwarps // NWARPS)


class AttentionWorkspace:
    """Preallocated split partials: acc [splits, T, Hq, D] and (m, l) [splits, T, Hq, 2] fp32.

    Capacity is in rows of T * Hq: a launch of T tokens uses at most max_rows // (T * Hq) splits
    (rounded down to whole blocks)."""

    def __init__(self, max_splits: int, max_T: int, Hq: int, D: int):
        if max_splits < NWARPS:
            raise ValueError(f"AttentionWorkspace: max_splits must be >= {NWARPS} (one block), got {max_splits}")
        if D > 32 * _MAX_DW:
            raise ValueError(f"AttentionWorkspace: head_dim <= {32 * _MAX_DW}, got {D}")
        self.max_splits, self.max_T, self.Hq, self.D = int(max_splits), int(max_T), int(Hq), int(D)
        n = self.max_splits * self.max_T * self.Hq
        self.acc = cuda.device_array(n * self.D, np.float32)
        self.ml = cuda.device_array(n * 2, np.float32)
        self._views: dict = {}
        self.n_sm = _sm_count()

    def views(self, splits: int, T: int):
        key = (splits, T)
        v = self._views.get(key)
        if v is None:
            n = splits * T * self.Hq
            v = (self.acc[: n * self.D].reshape(splits, T, self.Hq, self.D),
                 self.ml[: n * 2].reshape(splits, T, self.Hq, 2))
            self._views[key] = v
        return v


def _flat(a, dtype=None):
    """A C-contiguous pool array as a flat 1-D view (no copy), optionally reinterpreted."""
    if dtype is not None:
        a = a.view(dtype)
    return a.reshape(a.size)


def _cold_in_range(table, n_pages: int) -> bool:
    t = np.asarray(table)
    return bool((t[:, :, :n_pages] <= -2).any())


# (K fmt, V fmt, G, D) -> (mma_tiles, max_registers, mma_pipe, mma_qsmem, mma_bulk, mma_tm) where a measured variant beat
# the default:
# H200, commit cc0384c (uint64-index build), 131072 tokens, 32/8/128, CUDA-graph replay us, uncapped ->
# 128 registers: bf16 199 -> 164, iso3 168 -> 155, nvfp4/iso3 203 -> 154, nvfp4 229 -> 151
# (bench/results/attention_decode_variants_cc0384c.json). int8 is capped at 128: uncapped, its
# device-position build (the graphs' kernel) compiled to 128 registers at dd17991 (100.5 us; int8@r128
# 100.0) and to 130 at d26488a (3 blocks per SM: 111.9 us). bf16: software-pipelined loads, uncapped
# (166 registers, 3 blocks per SM), H200 at 9941117 and dd17991: 146.8 / 147.5 us against 154.6 / 156.1
# at 128 registers without (bench/results/logs/decode_variants_dd17991.json); the other formats gained
# nothing from it (nvfp4 93.7 vs 93.0, int8 116.3 vs 100.5). int8 keeps q's MMA fragments in shared memory (qsmem) at 128 registers: its chunk issues
# all 8 K/V loads before the first IMMA. 131072 tokens: H200 at 693f8b1 94.0 against 97.1 us, H100 at
# d023b36 122.9 against 125.7 (bench/results/attention_decode.json, logs/attention_decode_h100_d023b36.json).
# The 4-bit formats read their pages through the bulk ring (cp.async.bulk into shared memory): H100 at
# 167bb55, 131072 tokens, nvfp4 98.2 -> 90.7 us, iso3 108.5 -> 103.0, nvfp4/iso3 103.0 -> 96.6; int8 123.3
# -> 125.2, so not int8 (bench/results/logs/decode_bulk_h100_167bb55.json).
# The 4-bit formats put K's tokens on the MMA rows (tm), H100 at c22a5fb, graph replay us
# (bench/results/logs/decode_tm_h100_c22a5fb.json): 32/8/128 at 131072 / 360000 tokens nvfp4 89.8 ->
# 85.5 / 211.2 -> 195.7, iso3 101.6 -> 94.9 / 243.4 -> 224.8, nvfp4/iso3 95.7 -> 89.8 / 227.4 -> 209.1
# (bf16 198.9 either way); 24/4/256 with the ring at 168 registers (3 blocks an SM instead of 2)
# nvfp4 117.2 -> 98.7 / 261.6 -> 191.2, iso3 129.4 -> 107.4 / 296.1 -> 218.2; nvfp4/iso3 120.7 / 274.6
# at 29ea3c3 -> 101.2 / 203.1 at 835aea4 (logs/attention_decode_h100_{29ea3c3,835aea4}.json).
# The bundled model's 4/2/128 (G 2) had no entry (the plain loop, uncapped: 130 registers, 3 blocks an
# SM); the 32/8/128 4-bit knobs there, H100, graph replay us, nvfp4 at 4096 / 8192 / 16384 / 32768 /
# 65536 / 131072 tokens: 16.2 / 16.4 / 17.0 / 20.1 / 28.0 / 37.1 against 18.2 / 18.7 / 19.1 / 21.5 /
# 30.0 / 44.6, iso3 alike (logs/decode_g2_h100_ffc02d7.json, decode_g2_short_h100_2b193e5.json).
_MMA_TUNED = {(BF16, BF16, 4, 128): (0, None, True, False, False, False),
              (NVFP4, NVFP4, 4, 128): (0, 128, False, False, True, True),
              (INT8, INT8, 4, 128): (0, 128, False, True, False, False),
              (ISO3, ISO3, 4, 128): (0, 128, False, False, True, True),
              (NVFP4, ISO3, 4, 128): (0, 128, False, False, True, True),
              (NVFP4, NVFP4, 2, 128): (0, 128, False, False, True, True),  # the bundled model's shape
              (ISO3, ISO3, 2, 128): (0, 128, False, False, True, True),
              (NVFP4, ISO3, 2, 128): (0, 128, False, False, True, True),
              (NVFP4, NVFP4, 6, 256): (0, 168, False, False, True, True),
              (ISO3, ISO3, 6, 256): (0, 168, False, False, True, True),
              (NVFP4, ISO3, 6, 256): (0, 168, False, False, True, True)}


# Pages a warp from which `_MMA_TUNED`'s ring build reads 32-token chunks (mma_tiles 4) instead of
# 16, on GPUs of up to / above FAST_DRAM_TBPS of DRAM bandwidth. H100 (3.35 TB/s), 32/8/128, pages of
# 64 (docs/kernels.md "Tokens on the MMA rows"): nvfp4 40.6 / 87.1 / 182.0 us against 37.6 / 85.5 /
# 195.7 at 32768 / 131072 / 360000 tokens (2 / 8 / 22 pages a warp), iso3 alike: the crossover is
# near 11 pages a warp. H200 (4.8 TB/s), session 41, 131072 tokens (8 pages a warp): nvfp4 71.0
# against 78.7 us (bench/results/logs/attention_decode_h200_131072_3ffcc11.json). Twice the bytes
# in flight a warp pay sooner where the bandwidth x latency product is larger; fewer pages a warp,
# and iso3, are not measured there, so they keep the H100's rule.
FAST_DRAM_TBPS = 4.0
_LONG_CHUNKS = {(NVFP4, NVFP4, 4, 128): (12, 8), (ISO3, ISO3, 4, 128): (12, 12)}


def long_chunks(k_fmt, v_fmt, G: int, D: int, P: int, pages_per_warp: int, dram_tbps: float = 0.0) -> bool:
    """Whether `_MMA_TUNED`'s ring build (K, V, G, D) reads 32-token chunks for a split plan of
    `pages_per_warp` pages of P tokens on a GPU of `dram_tbps` (`_LONG_CHUNKS`; the ring copies
    whole chunks of a page)."""
    need = _LONG_CHUNKS.get((int(k_fmt), int(v_fmt), G, D))
    if need is None or P % 32:
        return False
    h100, fast_dram = need
    return pages_per_warp >= (fast_dram if dram_tbps > FAST_DRAM_TBPS else h100)


def mma_decode_build(k_fmt, v_fmt, G: int, D: int, mma_tiles=0, max_registers=None, mma_pipe=None,
                     mma_qsmem=None, mma_bulk=None, mma_tm=None) -> tuple:
    """(mma_tiles, max_registers, mma_pipe, mma_qsmem, mma_bulk, mma_tm) of the tensor-core decode
    kernel: the arguments, with `_MMA_TUNED`'s setting for (K, V, G, D) in place of the first four when
    all four are unset, and in place of mma_bulk / mma_tm when those are unset too."""
    if not mma_tiles and max_registers is None and mma_pipe is None and mma_qsmem is None:
        tuned = _MMA_TUNED.get((int(k_fmt), int(v_fmt), G, D), (0, None, False, False, False, False))
        return tuned[:4] + (tuned[4] if mma_bulk is None else bool(mma_bulk),
                            tuned[5] if mma_tm is None else bool(mma_tm))
    return mma_tiles, max_registers, bool(mma_pipe), bool(mma_qsmem), bool(mma_bulk), bool(mma_tm)


# Prefill kernels by name: paged_attention_cuda's keywords for chunks of more than one token.
# "wg8a": O += P V left running under the next tile's decode and barrier (session 15). "wg8w": a
# producer warpgroup decodes the tiles, two consumer warpgroups multiply (session 33), run each
# softmax under their last O += P V (session 34), keep Q in registers (session 35) and, with
# 4-bit or int8 K and V, load 16 bytes of codes a row at a time (sessions 36-37); "wg8w3" keeps
# three tiles of loads in flight.
# auto picks one of them per format (_prefill_auto). Measured and dropped (session 45's clean-up;
# git has them at aa6ad1a): "wg8pp" (the warpgroups of wg8 taking turns), "wg8s" (wg8a with S of
# the next tile issued under this one's softmax), "wg8w4" (four tiles of loads in flight), "wg8wss"
# and "wg8wn" (wg8w with Q in shared memory, and with 4-byte loads).
_WG = {"mma_prefill": "wg", "mma_warps": 8, "mma_pingpong": False, "mma_pv_async": False,
       "mma_ws": False, "mma_depth": 2}
_WS = {**_WG, "mma_pv_async": True, "mma_ws": True}  # wg8w
PREFILL_KERNELS = {  # every knob given (one left out would take auto's value)
    "fa": {"mma_prefill": "fa", "mma_warps": NWARPS, "mma_pv_async": False, "mma_ws": False,
           "mma_depth": 2},
    "wg": {**_WG, "mma_warps": 4},
    "wg8": _WG,
    "wg8a": {**_WG, "mma_pv_async": True},
    # the producer loads 16 bytes of 4-bit codes a row at a time (session 35's wg8ww); of int8 codes
    # too since session 36 (auto's for int8 K and V since session 37)
    "wg8w": _WS,
    # wg8w with a third tile of loads in flight in the producer (session 36; auto's for 4-bit K and V
    # since session 37)
    "wg8w3": {**_WS, "mma_depth": 3},
    # wg8w3 / wg8w whose consumer warpgroups take turns on the tensor cores (session 44, FA3's ping-pong;
    # wg8wpp auto's for int8 K and V since session 45)
    "wg8w3pp": {**_WS, "mma_depth": 3, "mma_pingpong": True},
    "wg8wpp": {**_WS, "mma_pingpong": True},
}


def _prefill_auto(D: int = 128, kf=None, vf=None) -> str:
    """The PREFILL_KERNELS name that "auto" runs for T > 1 (K and V formats kf, vf; None: not
    known yet). On an sm_90 GPU at head_dim <= 128: "wg8w3" when both planes are 4-bit or both
    bf16, "wg8wpp" when both are int8, else "wg8a"; elsewhere "fa" (wgmma needs sm_90, and its O
    accumulators head_dim <= 128). Each is the fastest measured for its formats (H100, T 2048 at
    32768 keys, 32/8/128: nvfp4 wg8w3 2492 us against wg8w's 2620 at 9bcd343 (wg8w3pp 2548
    against 2502 at 64c20eb), int8 wg8wpp 3288 against wg8w's 3431 at 64c20eb (wg8w 3430 against
    wg8a's 4185 at 9bcd343), bf16 wg8w3 3809 against wg8a's 4044 at 35b1cc2 (wg8w3pp the same at
    64c20eb)); every measurement behind the choices: docs/kernels.md, "_prefill_auto"."""
    if D > 128 or not _has_wgmma():
        return "fa"
    if (kf in (NVFP4, ISO3) and vf in (NVFP4, ISO3)) or kf == vf == BF16:
        return "wg8w3"
    return "wg8wpp" if kf == vf == INT8 else "wg8a"


def prefill_kernel(name: str, D: int, kf=None, vf=None) -> dict:
    """paged_attention_cuda's keywords (mma_prefill, mma_warps, ...) for a prefill kernel name of
    PREFILL_KERNELS, or "auto" (_prefill_auto's choice for head_dim D and the K / V formats on this
    GPU)."""
    if name == "auto":
        name = _prefill_auto(D, kf, vf)
    if name not in PREFILL_KERNELS:
        raise ValueError(f"unknown prefill attention kernel {name!r}: auto, {', '.join(PREFILL_KERNELS)}")
    return dict(PREFILL_KERNELS[name])


@functools.cache
def _gpu_cc() -> tuple:
    """The current GPU's compute capability; (9, 0) under the simulator, which emulates sm_90's PTX."""
    from numba import config

    return (9, 0) if config.ENABLE_CUDASIM else tuple(cuda.get_current_device().compute_capability)


def _has_wgmma() -> bool:
    """Whether the current GPU runs wgmma (sm_90 only: Blackwell has no wgmma); never under the simulator."""
    from numba import config

    return not config.ENABLE_CUDASIM and _gpu_cc() == (9, 0)


def _has_bulk_copy() -> bool:
    """Whether the current GPU has cp.async.bulk and mbarrier transaction counts (sm_90+), which the
    decode kernel's bulk ring needs; the simulator emulates them."""
    return _gpu_cc() >= (9, 0)


def _mma_arch(kf, vf) -> tuple:
    """The oldest GPU the tensor-core kernels run on for these formats: mma.sync m16n8k16 needs
    sm_80, and the 4-bit formats' E4M3 scales are decoded by cvt.rn.f16x2.e4m3x2 (sm_89)."""
    return (8, 9) if {int(kf), int(vf)} & {NVFP4, ISO3} else (8, 0)


def plan_prefill(T: int, H: int, G: int, L_max: int, P: int, n_sm: int, max_splits: int, mt: int = 1,
                 resident: int = 0):
    """(query blocks, splits) of the prefill kernel (attention_prefill): blocks of NWARPS * mt *
    (16 // G) query tokens (mt: warps per block / NWARPS); the pages are split so that the grid has ~4 blocks per
    SM (its kernels hold ~2 per SM), at most `max_splits` (workspace) and one page per split.
    Given `resident` (blocks of the kernel the GPU holds at once), a grid that fills that wave
    unsplit gets one split: splitting it further only adds the reduce (~70 us per 2048-token
    chunk-layer at 4 splits, 9 ms of a 32k prompt of the bundled model on the H200) and more
    waves."""
    nqb = -(-T // (NWARPS * mt * (16 // G)))
    if resident and nqb * H >= resident:
        return nqb, 1
    npages = max(1, -(-L_max // P))
    want = -(-(n_sm * 4) // (nqb * H))
    return nqb, max(1, min(want, max_splits, npages))


_RESIDENT: dict = {}


def _resident_blocks(kern, sig: str, threads: int = THREADS, dynsmem: int = 0) -> int:
    """Blocks of `threads` threads of `kern` that are resident on the whole GPU at once (its
    registers and shared memory, static and `dynsmem` dynamic, per SM x SMs), compiled for `sig`
    to find out; 0 (no limit known) under the simulator."""
    from numba import config

    if config.ENABLE_CUDASIM:
        return 0
    key = (id(kern), sig, threads, dynsmem)
    if key not in _RESIDENT:
        _RESIDENT[key] = int(kern.compile(sig).max_cooperative_grid_blocks(threads, dynsmem))
    return _RESIDENT[key]


def _use_mma(kernel: str, kf, vf, G, D) -> bool:
    if kernel == "fma":
        return False
    from numba import config

    from coldkv.numba_kernels import attention_mma

    ok = attention_mma.supports(kf, vf, G, D)
    if kernel == "mma" and not ok:
        raise ValueError(f"attention_cuda: the tensor-core kernel needs G <= 8, head_dim % 64 == 0 "
                         f"(K={kf} V={vf} G={G} D={D})")
    if ok and _gpu_cc() < _mma_arch(kf, vf):  # an older GPU: the fp32 kernel, or a clear error
        if kernel == "mma":
            raise ValueError("attention_cuda: the tensor-core kernel for K={} V={} needs an sm_{}{} or newer GPU, "
                             "this one is sm_{}{}".format(kf, vf, *_mma_arch(kf, vf), *_gpu_cc()))
        return False
    if config.ENABLE_CUDASIM:  # emulated there (mma_ptx.py): only on request
        if kernel == "mma":
            from coldkv.numba_kernels.mma_ptx import _sim_install

            _sim_install()
        return ok and kernel == "mma"
    return ok


def paged_attention_cuda(q, out, pos0, sm_scale, k_fmt, k_codes, k_scales, v_fmt, v_codes, v_scales,
                         gscale, table, ws: AttentionWorkspace, stream=0, check_cold=True, max_registers=None,
                         plan_len=None, kernel="auto", mma_tiles=0, mma_u64=True, mma_prefill=None,
                         mma_warps=None, mma_pipe=None, mma_k8=True, prefill_scratch=None, mma_chb=0,
                         mma_pingpong=False, mma_pv_async=None, mma_qsmem=None, mma_bulk=None,
                         mma_tm=None, mma_pdl=False, out16=None, out16_fp16=False, mma_ws=None, mma_depth=None):
    """out[t, hq] = softmax(q[t, hq] . K[0..pos0+t]) V over the paged cache (same contract as
    attention.paged_attention_cpu). q, out [T, Hq, D] f32 device arrays; codes/scales the layer's
    pools (codes are read as 32-bit words); gscale [2, H] f32; table [2, H, max_pages] int32.
    Enqueues two kernels on `stream`; no device allocation. out16: None, or a [T, Hq, D] u16 device
    array that also gets the output rounded to bf16 (fp16 with out16_fp16), written by the split
    merge, or by the prefill kernel when a chunk has one split (it then writes out itself).

    pos0: an int, or an int32 device array of shape [1] holding it (device-position mode, for
    CUDA graphs: the kernel reads the position when it runs, so one captured launch serves every
    decode step). In that mode the host never reads the position (no sync, no allocation, no
    cold-page check) and `plan_len` is required: the largest pos0 + T the launch will see (e.g.
    the cache's token capacity); the split grid is planned for it and each split takes its share
    of the pages of the actual length. With an int, `plan_len` (optional, >= pos0 + T) does the
    same planning; by default the grid is planned for pos0 + T.

    kernel: "mma" the tensor-core kernel (attention_mma: q and P rounded to 16 bits, GPU only),
    "fma" the fp32 CUDA-core kernel here (also runs under the simulator), "auto" mma where it
    applies (a GPU, G <= 8). With the tensor-core kernel, a chunk of T > 1 query tokens runs a
    prefill kernel ((token, q head) pairs on the MMA rows): `mma_prefill` None = the default
    (`_prefill_auto`), "fa" (attention_prefill._build_prefill_fa: FA2-style, double-buffered shared tiles),
    "wg" (the same on Hopper warpgroup MMAs, sm_90a, head_dim <= 128, 4 or 8 warps),
    False = the decode kernel (one token per warp, the previous path);
    True or a name also applies at T = 1. mma_tiles / max_registers / mma_u64 (uint64 indices, the
    default since it measured faster) / mma_pipe (the decode kernel's software-pipelined loads) /
    mma_warps / mma_chb (keys per shared tile of "wg") /
    mma_pingpong (with mma_ws: the consumer warpgroups take turns on the tensor cores) / mma_pv_async
    ("wg": O += P V runs on under the next tile's decode; None: auto's choice when the kernel
    and warps are auto's, else off) / mma_ws (None: auto's likewise; "wg" with 8 warps: a producer
    warpgroup loads and decodes the tiles, attention_prefill's attn_ws; bf16 planes since session
    40) / mma_depth (None: auto's likewise; with mma_ws, 3 tiles of loads in flight in the producer
    instead of 2): tuning knobs of the benchmark
    (attention_mma.get_kernel / attention_prefill.get_prefill_kernel). mma_k8 (default on): the decode kernel's
    K product on int8 tensor cores for int8 keys (`attention_mma.supports_k8`; q as a 16-bit
    integer per head in two int8 parts), else ignored. mma_qsmem: the decode kernel keeps q's MMA
    fragments in shared memory instead of registers (attention_mma._build's qsmem; with a lower
    max_registers, more blocks an SM). mma_tiles, max_registers, mma_pipe and mma_qsmem all unset:
    `_MMA_TUNED`'s setting for the (K, V, G, D). mma_bulk: the decode kernel reads its pages through a
    shared-memory ring filled by Hopper bulk copies (attention_mma._build's bulk; pages of a multiple
    of its chunk's rows: True refuses others, None = `_MMA_TUNED`'s, which then falls back).
    mma_tm: the decode kernel's K product with tokens on the MMA rows (attention_mma._build's tm;
    4-bit or bf16 keys, V not int8: `attention_mma.supports_tm`; None = `_MMA_TUNED`'s).
    mma_pdl: the decode kernel's split merge as a programmatic dependent launch (launch.py: its
    launch and block start-up under the attention kernel's last blocks; sm_90+, else an error).
    Off by default: 1-2% slower at every context on the H100 (ffa233c, docs/kernels.md Decode 1).

    prefill_scratch: None, or (K, V) flat uint32 device arrays of >= pool rows x D / 2 words: with
    the "fa" prefill kernel, nvfp4/iso3 planes are first decoded once into them
    (attention_prefill.launch_predecode) and the kernel copies their 16-bit rows like bf16 ones,
    instead of every query block decoding every tile (bitwise the same output)."""
    T, Hq, D = q.shape
    H = table.shape[1]
    G = Hq // H
    P = k_codes.shape[1]
    if T > ws.max_T or Hq != ws.Hq or D != ws.D:
        raise ValueError(f"attention workspace is for T<={ws.max_T}, Hq={ws.Hq}, D={ws.D}; got {T}, {Hq}, {D}")
    devpos = not isinstance(pos0, (int, np.integer))
    if devpos:
        if plan_len is None:
            raise ValueError("attention_cuda: a device position (int32 array, position at [0]) needs plan_len=")
        if pos0.ndim != 1 or pos0.shape[0] < 1 or pos0.dtype != np.int32:
            raise ValueError(f"attention_cuda: a device position is a 1-D int32 array with the position at [0], "
                             f"got {pos0.dtype}{tuple(pos0.shape)}")
    if out16 is not None and (tuple(out16.shape) != (T, Hq, D) or out16.dtype != np.uint16):
        raise ValueError(f"attention_cuda: out16 is a [T, Hq, D] = {(T, Hq, D)} uint16 array, "
                         f"got {out16.dtype}{tuple(out16.shape)}")
    if T == 0:
        return out
    L_max = int(plan_len) if plan_len is not None else int(pos0) + T
    if not devpos:
        if L_max < int(pos0) + T:
            raise ValueError(f"attention_cuda: plan_len {L_max} < pos0 + T = {int(pos0) + T}")
        if check_cold and isinstance(table, np.ndarray) and _cold_in_range(table, -(-(int(pos0) + T) // P)):
            raise NotImplementedError("attention_cuda: cold-slot pages (table entries <= -2) are not decoded yet")
    qscale = np.float32(sm_scale * _LOG2E)
    use_mma = _use_mma(kernel, k_fmt, v_fmt, G, D)
    auto = PREFILL_KERNELS[_prefill_auto(D, k_fmt, v_fmt)]  # (read only: no copy per launch)
    auto_prefill, auto_warps = auto["mma_prefill"], auto["mma_warps"]
    prefill = auto_prefill if mma_prefill is None or mma_prefill is True else mma_prefill
    if mma_warps is None:
        mma_warps = auto_warps if prefill == auto_prefill else NWARPS
    is_auto = prefill == auto_prefill and mma_warps == auto_warps and not mma_pingpong
    mma_ws = bool(auto["mma_ws"] if mma_ws is None and is_auto else mma_ws)
    mma_depth = int(auto["mma_depth"] if mma_depth is None and is_auto else mma_depth or 2)
    if mma_pv_async is None:  # auto's, for auto's kernel and warps
        mma_pv_async = is_auto and auto["mma_pv_async"]
    if use_mma and prefill and (T > 1 or mma_prefill is not None):
        from coldkv.numba_kernels import attention_prefill

        if prefill not in ("fa", "wg"):
            raise ValueError(f"attention_cuda: mma_prefill {prefill!r} is not a prefill kernel (fa, wg; False for "
                             "the decode kernel)")
        wg = prefill == "wg"
        per_block = mma_warps // NWARPS  # tokens per block / (NWARPS * 16 // G)
        pre = (False, False)
        # fa reads pre-decoded 4-bit planes; wg decodes in the block: end to end at 32k (nvfp4) 0.647x
        # HF against 0.576x pre-decoded (bench/results/logs/generate_predecode_2cbb620.json)
        if prefill_scratch is not None and not wg:
            pre = (k_fmt in (NVFP4, ISO3), v_fmt in (NVFP4, ISO3))
        kern = attention_prefill.get_prefill_kernel(
            k_fmt, v_fmt, G, D, devpos, kind=prefill, warps=mma_warps, max_registers=max_registers or None,
            chb=mma_chb if wg else 0, pre=pre, pingpong=mma_pingpong,
            pv_async=mma_pv_async, ws=mma_ws, depth=mma_depth)
        threads = attention_prefill.prefill_threads(mma_warps, mma_ws)
        dyn = attention_prefill.wg_smem_bytes(D, mma_chb, mma_warps, mma_ws) if wg else 0
        sig = attention_prefill.prefill_sig(k_fmt, v_fmt, devpos)
        if dyn:
            attention_prefill.wg_prepare(kern, sig, dyn)
        resident = _resident_blocks(kern, sig, threads, dyn)
        # workspace rows: max_splits * max_T * Hq, so a chunk of T tokens has this many splits
        nqb, splits = plan_prefill(T, H, G, L_max, P, ws.n_sm, ws.max_splits * ws.max_T // T, per_block, resident)
        ws_acc, ws_ml = ws.views(splits, T)
        direct = splits == 1
        if direct:  # the kernel normalizes and writes out ([1, T, Hq, D] view): no reduce
            ws_acc = out.reshape(1, T, Hq, D)
        ksc = _flat(k_scales, np.uint32) if k_fmt in (NVFP4, ISO3) else _flat(k_scales)
        vsc = _flat(v_scales, np.uint32) if v_fmt in (NVFP4, ISO3) else _flat(v_scales)
        words = [_flat(k_codes, np.uint32), _flat(v_codes, np.uint32)]
        for plane, (fmt, codes, sc) in enumerate(((k_fmt, k_codes, ksc), (v_fmt, v_codes, vsc))):
            if pre[plane]:  # decoded once here, copied by the kernel
                if prefill_scratch[plane].size < codes.shape[0] * P * D // 2:
                    raise ValueError("attention_cuda: prefill_scratch holds fewer than pool rows x head_dim / 2 words")
                attention_prefill.launch_predecode(fmt, D, pos0, T, L_max, P, words[plane], sc, table, plane,
                                                   prefill_scratch[plane], stream)
                words[plane] = prefill_scratch[plane]
        # a one-split launch writes out16 itself; split ones leave it to the merge
        to16, o16 = _to16_args(out, out16, out16_fp16, write=direct)
        kern[(nqb, splits, H), threads, stream, dyn](q, pos0, qscale, P, words[0], ksc, words[1], vsc, gscale,
                                                     table, ws_acc, ws_ml, o16, to16)
        if not direct:
            _reduce(ws_acc, ws_ml, splits, out, stream, out16, out16_fp16)
        return out
    if use_mma:
        from coldkv.numba_kernels import attention_mma

        asked_bulk = mma_bulk
        auto_build = not mma_tiles and max_registers is None and mma_pipe is None and mma_qsmem is None
        mma_tiles, max_registers, mma_pipe, mma_qsmem, mma_bulk, mma_tm = mma_decode_build(
            k_fmt, v_fmt, G, D, mma_tiles, max_registers, mma_pipe, mma_qsmem, mma_bulk, mma_tm)
        k8 = bool(mma_k8) and attention_mma.supports_k8(k_fmt, G, D)
        if mma_bulk and P % (8 * (mma_tiles or 2)):  # the ring copies whole chunks of a page
            if asked_bulk:
                raise ValueError(f"attention_cuda: mma_bulk needs pages of a multiple of {8 * (mma_tiles or 2)} "
                                 f"tokens, got {P}")
            mma_bulk = False
        if mma_bulk and not _has_bulk_copy():  # before Hopper: the same kernel loading from global memory
            if asked_bulk:
                raise ValueError("attention_cuda: mma_bulk needs an sm_90 or newer GPU (cp.async.bulk)")
            mma_bulk = False
        if mma_pdl and not (_gpu_cc() >= (9, 0) and has_dependent_launch()):
            raise ValueError("attention_cuda: mma_pdl needs an sm_90 or newer GPU and a cuda.core with "
                             "programmatic_stream_serialization")
        def build(dp: bool, tiles: int):  # the decode kernel of these knobs, device position dp
            return attention_mma.get_kernel(k_fmt, v_fmt, G, D, dp, tiles, max_registers, mma_u64, mma_pipe, k8,
                                            mma_qsmem, bool(mma_bulk), mma_tm, bool(mma_pdl))

        kern = build(devpos, mma_tiles)
        # planned from the device-position build (the graphs' kernel): an int-position launch gets the
        # same splits, so eager and graph decode add in the same order (its occupancy may differ)
        gsig = attention_mma.kernel_sig(k_fmt, v_fmt, True)
        resident = _resident_blocks(build(True, mma_tiles), gsig)
        ppw, nblk = plan_splits(T, H, L_max, P, ws.n_sm, ws.max_splits, resident)
        if (auto_build and mma_bulk and mma_tm and not mma_tiles
                and long_chunks(k_fmt, v_fmt, G, D, P, ppw, _dram_tbps())):
            # many pages a warp: the ring's 32-token chunks (measured faster from ~11 pages a warp on
            # an H100, at 8 on an H200); kept only with the same residency, hence the same plan:
            # eager and graph add alike
            if _resident_blocks(build(True, 4), gsig) == resident:
                kern = build(devpos, 4)
        ksc = _flat(k_scales, np.uint32) if k_fmt in (NVFP4, ISO3) else _flat(k_scales)
        vsc = _flat(v_scales, np.uint32) if v_fmt in (NVFP4, ISO3) else _flat(v_scales)
    else:
        _, nblk = plan_splits(T, H, L_max, P, ws.n_sm, ws.max_splits)
        kern = get_kernel(k_fmt, v_fmt, G, D, max_registers, devpos)
        ksc, vsc = _flat(k_scales), _flat(v_scales)
    splits = nblk if use_mma else nblk * NWARPS  # the tensor-core kernel merges its warps per block
    ws_acc, ws_ml = ws.views(splits, T)
    kern[(T, nblk, H), THREADS, stream](q, pos0, qscale, P, _flat(k_codes, np.uint32), ksc,
                                        _flat(v_codes, np.uint32), vsc, gscale, table, ws_acc, ws_ml)
    _reduce(ws_acc, ws_ml, splits, out, stream, out16, out16_fp16, pdl=use_mma and bool(mma_pdl))
    return out


# ==================================================================================== PTX check
_SCALE_T = {BF16: "uint8", INT8: "float32", NVFP4: "uint8", ISO3: "uint8"}


def kernel_sig(kf, vf, devpos=False, scale_t=_SCALE_T):
    """The attention kernels' signature (this file's and attention_mma's, which reads the 4-bit
    scales as uint32 words: its own scale_t)."""
    pos = "int32[::1]" if devpos else "int64"
    return (f"void(float32[:,:,::1], {pos}, float32, int64, uint32[::1], {scale_t[kf]}[::1], "
            f"uint32[::1], {scale_t[vf]}[::1], float32[:,::1], int32[:,:,::1], "
            "float32[:,:,:,::1], float32[:,:,:,::1])")


def _ptx_signatures() -> tuple[list, list]:
    """(CI's list: every branch of the merges, each format as K and V at the main shape, the other
    lane layouts, the device-position build; the rest, run with -m slow: the mixed format pairs)."""
    red = "void(float32[:,:,:,::1], float32[:,:,:,::1], int64, float32[:,:,::1], uint16[:,:,::1])"
    out = [(kern(to16, pdl), red) for kern in (_reduce_kernel, _reduce_rows_kernel)  # every branch once
           for to16, pdl in ((TO16_NONE, False), (TO16_BF16, False), (TO16_FP16, True))]
    more = []
    for kf in SUPPORTED_FORMATS:  # every format pair at the main shape
        for vf in SUPPORTED_FORMATS:
            (out if kf == vf else more).append((get_kernel(kf, vf, 4, 128), kernel_sig(kf, vf)))
    for kf, vf, G, D in [(NVFP4, NVFP4, 1, 64), (BF16, INT8, 6, 256), (INT8, ISO3, 8, 128),
                         (NVFP4, BF16, 6, 64)]:  # other lane layouts
        out.append((get_kernel(kf, vf, G, D), kernel_sig(kf, vf)))
    out.append((get_kernel(NVFP4, NVFP4, 4, 128, devpos=True), kernel_sig(NVFP4, NVFP4, True)))
    return out, more


PTX_SIGNATURES, PTX_SIGNATURES_MORE = _ptx_signatures()
