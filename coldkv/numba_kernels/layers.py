"""The per-token kernels of the CUDA forward pass, each beside its numpy reference.

Dtypes: the residual stream, q and attention outputs are float32; a row that feeds a GEMM is
rounded once to the checkpoint's 16-bit type (uint16 bits, round to nearest even): bf16, or fp16
for an fp16 checkpoint (F16 = True), because cuBLAS multiplies 16-bit x 16-bit (fp32 accumulate)
against the weights as stored. The QKV and gate|up GEMMs write that 16-bit type too (cuBLAS
rounds their fp32 sums once, as HF's bf16 Linear layers do), which the kernels reading them decode;
the o_proj and down GEMMs accumulate into the float32 residual. Norm weights are float32.
"16(...)" below is that rounding.

  embed_kernel(F16)     x[t] = row tokens[t] of the 16-bit table                [T, dim] f32
  rms_norm_kernel(R, VPL, F16)  h = 16(x / rms(x) * w)                          [T, dim] u16
  qkv_rope_append_kernel(NV)  per (token, head): + bias, q/k RMSNorm (Qwen3), RoPE; q -> q_out;
                        K/V quantized straight into the layer's pages (write_pages=1), or
                        written as fp32 to kv_out (the first chunk, for the 4-bit scales;
                        q_out is not written then)
  kv_amax_kernel, kv_gscale_kernel  second-level scale of each (K/V, head) from a chunk's
                        max |x| (maxima of token slices, then one per (K/V, head))
  swiglu_kernel(F16)    a = 16(silu(gate) * up)                                 [T, inter] u16
  add_bias_kernel
(The attention output's 16(o), o_proj's input, is written by the attention kernels themselves.)
Builders (name(constants)) return a kernel compiled for a row length, so that its per-thread values
stay in registers and every loop over them unrolls. Every kernel loads what it needs before its
first store: Numba arrays may alias, so no load is moved above a store, and a load after a store
costs a whole memory latency.
The references (`*_ref`) are the spec the tests hold the kernels to; the CPU model
(runtime/model.py) computes the same math in float32 without the 16-bit roundings.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from coldkv.numba_kernels.jit_cache import cuda_kernel
from coldkv.numba_kernels.fp import bf16_dec, bf16_enc, f16_dec, f16_enc, global_scale_for, int8_enc
from coldkv.numba_kernels.quant import (BF16, INT8, abs_or_inf, encode_pair, group_mult, group_scale,
                                        int8_row_scale, ref_bf16_decode, ref_bf16_encode)

ROW_THREADS = 128  # threads a block for the row kernels
ROW_WARPS = 4  # = ROW_THREADS // 32 (array shapes in kernels must be plain constants)
WARPS = 4  # warps per block of the per-(token, head) kernel
MAX_HEAD_DIM = 256
# Array indices in the row kernels are unsigned: Numba wraps a negative signed index (a 64-bit
# compare and select per access), and with the 64-bit address arithmetic that made rms_norm,
# qkv_rope_append and swiglu issue-bound on the ALU pipe (ncu, H100 at 2ffeb58:
# bench/results/logs/ncu_layers_h100_2ffeb58.txt). rms_norm's SASS at n 384: 1048 -> 592 instructions.
U32 = np.uint32
RMS_VPL = 16  # most values of a row one thread of rms_norm_kernel holds
MAX_ROW = 1024 * RMS_VPL  # longest row rms_norm_kernel takes (a block of 1024 threads)
ROWS_IN_FLIGHT = 4  # rows an elementwise kernel's thread loads before it stores any
GSCALE_HEADROOM = np.float32(4.0)  # calibration: g = global_scale_for(4 max|x|), CPU cache too
GSCALE_SLICES = 512  # token slices per (K/V, head) whose maxima kv_amax_kernel finds in parallel


# ==================================================================================== references
def ref_encode16(x: np.ndarray, f16: bool = False) -> np.ndarray:
    """float32 -> bf16 (or IEEE half when f16) bits, round to nearest even."""
    if f16:
        with np.errstate(over="ignore"):  # overflow to inf, as the kernels do
            return np.asarray(x, np.float32).astype(np.float16).view(np.uint16)
    return ref_bf16_encode(x)


def ref_decode16(h: np.ndarray, f16: bool = False) -> np.ndarray:
    return np.asarray(h, np.uint16).view(np.float16).astype(np.float32) if f16 else ref_bf16_decode(h)


def rms_norm_ref(x: np.ndarray, w: np.ndarray, eps: float, f16: bool = False) -> np.ndarray:
    """x [T, n] f32, w [n] f32 -> 16-bit bits [T, n] of x / sqrt(mean(x^2) + eps) * w."""
    var = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    return ref_encode16((x / np.sqrt(var + eps) * w).astype(np.float32), f16)


def qkv_post_ref(qkv, bias, q_norm, k_norm, cos, sin, pos0: int, eps: float, nq: int, nkv: int, f16: bool = False):
    """qkv [T, (nq + 2 nkv) D] 16-bit bits -> q [T, nq, D], k [T, nkv, D], v [T, nkv, D] float32:
    bias, then q/k RMSNorm (when given), then RoPE (rotate_half layout) at positions pos0.."""
    qkv = ref_decode16(qkv, f16)
    T = qkv.shape[0]
    D = qkv.shape[1] // (nq + 2 * nkv)
    x = (qkv + (bias if bias is not None else 0)).reshape(T, nq + 2 * nkv, D).astype(np.float64)
    q, k, v = x[:, :nq], x[:, nq:nq + nkv], x[:, nq + nkv:]
    if q_norm is not None:
        q = q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True) + eps) * q_norm
        k = k / np.sqrt(np.mean(k * k, axis=-1, keepdims=True) + eps) * k_norm
    c, s = cos[pos0:pos0 + T, None, :], sin[pos0:pos0 + T, None, :]

    def rope(y):
        y1, y2 = y[..., :D // 2], y[..., D // 2:]
        return np.concatenate([y1 * c - y2 * s, y2 * c + y1 * s], axis=-1)

    return rope(q).astype(np.float32), rope(k).astype(np.float32), v.astype(np.float32)


def swiglu_ref(gu: np.ndarray, f16: bool = False) -> np.ndarray:
    """gu [T, 2 I] 16-bit bits (gate | up) -> 16-bit bits [T, I] of silu(gate) * up."""
    gu = ref_decode16(gu, f16)
    n = gu.shape[1] // 2
    g = gu[:, :n].astype(np.float64)
    return ref_encode16((g / (1 + np.exp(-g)) * gu[:, n:]).astype(np.float32), f16)


def embed_ref(tokens: np.ndarray, table16: np.ndarray, f16: bool = False) -> np.ndarray:
    return ref_decode16(table16[tokens], f16)


# ==================================================================================== kernels
@functools.lru_cache(maxsize=None)
def embed_kernel(F16: bool):
    """x [T, dim] f32 = rows tokens[t] of table [V, dim] u16 (bf16, or fp16 bits when F16); a block
    per token, ROWS_IN_FLIGHT values a thread loaded before it stores."""
    dec = f16_dec if F16 else bf16_dec

    @cuda_kernel
    def embed(tokens, table, x):
        t = cuda.blockIdx.x
        tok = tokens[t]
        n, bd = x.shape[1], cuda.blockDim.x
        v = cuda.local.array(ROWS_IN_FLIGHT, np.uint16)
        for c in range(cuda.threadIdx.x, n, ROWS_IN_FLIGHT * bd):
            for k in range(ROWS_IN_FLIGHT):
                v[k] = table[tok, c + k * bd] if c + k * bd < n else np.uint16(0)
            for k in range(ROWS_IN_FLIGHT):
                if c + k * bd < n:
                    x[t, c + k * bd] = dec(v[k])

    return embed


@cuda.jit(device=True)
def _warp_sum(v):
    for m in (16, 8, 4, 2, 1):
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, m)
    return v


@cuda.jit(device=True, inline=True)
def _lanes_max(v, lanes):
    """Max of v over aligned groups of `lanes` (a power of two <= 32) lanes."""
    o = lanes // 2
    while o > 0:
        v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, o))
        o //= 2
    return v


@functools.lru_cache(maxsize=None)
def rms_norm_kernel(R: int, VPL: int, F16: bool = False):
    """out [T, n] u16 = 16(x / sqrt(mean(x^2) + eps) * w) (bf16, or fp16 when F16) for n <= R * VPL:
    R threads per row (a power of two from 32), each holding its VPL values and weights in
    registers; sums of squares by shuffles, and for R > 32 through shared memory (one barrier).
    A row is read once: the second
    pass of the old kernel re-read x and w after each bf16 store (Numba arrays may alias, so no
    load moves above a store: 12 serial load latencies a row at n 384)."""
    B = max(R, ROW_THREADS)  # threads a block
    RPB, W, NW = B // R, R // 32, B // 32  # rows a block, warps a row, warps a block
    enc = f16_enc if F16 else bf16_enc

    @cuda_kernel
    def rms_norm(x, w, eps, out):
        tid = cuda.threadIdx.x
        row = U32(cuda.blockIdx.x * RPB + tid // R)  # unsigned indices: see U32
        i = U32(tid % R)
        T, n = x.shape
        live = row < T  # no early return: a row of several warps meets at a barrier
        v = cuda.local.array(VPL, np.float32)
        wv = cuda.local.array(VPL, np.float32)
        for j in range(VPL):
            c = i + U32(R * j)
            v[j] = x[row, c] if live and c < n else np.float32(0.0)
            wv[j] = w[c] if c < n else np.float32(0.0)
        ss = np.float32(0.0)
        for j in range(VPL):
            ss += v[j] * v[j]
        ss = _warp_sum(ss)
        if W > 1:
            part = cuda.shared.array(NW, np.float32)
            if tid % 32 == 0:
                part[tid // 32] = ss
            cuda.syncthreads()
            ss = np.float32(0.0)
            for k in range(W):
                ss += part[(tid // R) * W + k]
        inv = np.float32(1.0) / math.sqrt(ss / np.float32(n) + np.float32(eps))
        if live:
            for j in range(VPL):
                c = i + U32(R * j)
                if c < n:
                    out[row, c] = enc(v[j] * inv * wv[j])

    return rms_norm


def rms_norm_shape(n: int) -> tuple[int, int]:
    """(threads a row R, values a thread VPL) of rms_norm_kernel for rows of n values: the fewest
    threads that hold a row in at most RMS_VPL registers each."""
    R = 32
    while -(-n // R) > RMS_VPL and R < 1024:
        R *= 2
    if n > MAX_ROW:
        raise ValueError(f"rms_norm: rows of at most {MAX_ROW} values, got {n}")
    return R, -(-n // R)


@functools.lru_cache(maxsize=None)
def qkv_rope_append_kernel(NV: int, F16: bool = False):
    """The fused q/k/v kernel for head_dim 32 NV; a warp per (token t, head slot s), launched as
    grid (T, ceil(S / WARPS)): slots [0, Hq) are q heads, then Hq..Hq+H-1 K, then V.

    qkv [T, (Hq + 2H) D] u16 (the fused QKV GEMM's output: bf16, or fp16 bits when F16); bias
    [(Hq + 2H) D] f32 or empty;
    q_norm/k_norm [D] or empty; cos/sin [positions, D/2]; pos int32 device: pos[0] the chunk's first
    position (device-resident so a captured graph serves every decode step); q_out [T, Hq, D];
    kv_out [2, T_max, H, D] fp32 scratch; K/V tables [H, max_pages]; gscale [2, H].
    Lane j-th value is column lane + 32 j, so RoPE's partner column (c + D/2) is in the same lane.
    NV is a constant so that every slot loop unrolls without a branch: with the runtime count of
    the old kernel, each bias / norm-weight load sat in its own branch, one load latency after
    another (~20 a warp)."""
    HALF = NV // 2
    dec = f16_dec if F16 else bf16_dec

    # the 4-bit encode: a lane holds VL consecutive columns (a power of two >= NV, so a 16-value
    # group is GL whole lanes; at d 192 lanes 24.. hold none), after a pass through shared memory
    VL = 2 if NV <= 2 else 4 if NV <= 4 else 8
    GL = 16 // VL
    ROW = 32 * NV  # head_dim (a constant here: a shared array's shape must be one)

    @cuda.jit(device=True)
    def append_row(fmt, vals, g, page, row, codes, scales, lane, tbuf):
        """Append the warp's row (lane's value slot j = column lane + 32 j) as row `row` of pool
        page `page` in a hot format. Every lane encodes its own values with the CPU kernel's scalar
        cores (quant.quantize_chunk's, so the pages are bit-identical); a group's max comes from
        shuffles: over the warp for int8's row scale; for the 4-bit formats the row goes through
        the warp's tbuf so that a lane holds columns VL lane .. + VL - 1, and a group's max is one
        reduction over its GL lanes (it was one over 16 lanes per slot, 4 chains at d 128, and
        half the lanes idle in the encode)."""
        if fmt == BF16:
            for j in range(NV):
                codes[page, row, U32(lane + 32 * j)] = bf16_enc(vals[j])
            return
        if fmt == INT8:  # one scale for the row
            amax = np.float32(0.0)
            for j in range(NV):
                amax = max(amax, abs_or_inf(vals[j]))
            amax = _lanes_max(amax, 32)
            scale, inv = int8_row_scale(amax)
            if lane == 0:
                scales[page, row, 0] = scale
            for j in range(NV):
                codes[page, row, U32(lane + 32 * j)] = int8_enc(vals[j], inv) if inv > np.float32(0.0) else 0
            return
        for j in range(NV):  # nvfp4 / iso3
            tbuf[U32(lane + 32 * j)] = vals[j]
        cuda.syncwarp()
        c0 = VL * lane
        live = c0 < ROW
        x = cuda.local.array(VL, np.float32)
        amax = np.float32(0.0)
        for i in range(VL):
            x[i] = tbuf[U32(c0 + i)] if live else np.float32(0.0)
            amax = max(amax, abs_or_inf(x[i]))
        amax = _lanes_max(amax, GL)
        sb = group_scale(fmt, amax, g)
        if live:
            if lane % GL == 0:
                scales[page, row, U32(c0 >> 4)] = sb
            m = group_mult(sb, g)
            for i in range(VL // 2):
                codes[page, row, U32((c0 >> 1) + i)] = encode_pair(fmt, x[2 * i], x[2 * i + 1], m, sb)

    @cuda_kernel
    def qkv_rope_append(qkv, bias, q_norm, k_norm, cos, sin, pos, eps, q_out, kv_out,
                        k_fmt, k_table, k_codes, k_scales, v_fmt, v_table, v_codes, v_scales, gscale,
                        write_pages):
        Hq, D = q_out.shape[1], q_out.shape[2]
        H = kv_out.shape[2]
        t = cuda.blockIdx.x
        s = cuda.blockIdx.y * WARPS + cuda.threadIdx.x // 32
        lane = cuda.threadIdx.x % 32
        if s >= Hq + 2 * H or (write_pages == 0 and s < Hq):
            return  # whole warps only; the calibration pass (fp32 K/V out) leaves q to the second
        p = pos[0] + t
        rotated = s < Hq + H  # q and K heads: norm and RoPE
        normed = rotated and q_norm.shape[0] > 0
        plane = 0 if s < Hq + H else 1
        h = s - Hq - plane * H
        # every load first, all in one wave: in program order after the first computations, each
        # group waited for the one before (norm weights after the norm's shuffles, then cos/sin)
        vals = cuda.local.array(NV, np.float32)
        for j in range(NV):
            vals[j] = dec(qkv[U32(t), U32(s * D + lane + 32 * j)])
        w = q_norm if s < Hq else k_norm
        wv = cuda.local.array(NV, np.float32)
        if normed:
            for j in range(NV):
                wv[j] = w[U32(lane + 32 * j)]
        co = cuda.local.array(HALF, np.float32)
        si = cuda.local.array(HALF, np.float32)
        if rotated:
            for j in range(HALF):
                co[j] = cos[U32(p), U32(lane + 32 * j)]
                si[j] = sin[U32(p), U32(lane + 32 * j)]
        P = k_codes.shape[1] if plane == 0 else v_codes.shape[1]
        lp = 0  # the page-table column: K/V rows that go into pages only (q warps skip the division)
        page = -1
        if s >= Hq and write_pages != 0:
            lp = p // P
            page = (k_table if plane == 0 else v_table)[U32(h), U32(lp)]
        if bias.shape[0] > 0:
            for j in range(NV):
                vals[j] += bias[U32(s * D + lane + 32 * j)]
        if normed:
            ss = np.float32(0.0)
            for j in range(NV):
                ss += vals[j] * vals[j]
            inv = np.float32(1.0) / math.sqrt(_warp_sum(ss) / np.float32(D) + np.float32(eps))
            for j in range(NV):
                vals[j] = vals[j] * inv * wv[j]
        if rotated:
            for j in range(HALF):  # the pair (c, c + D/2) is this lane's slots j, j + HALF
                x1 = vals[j]
                x2 = vals[j + HALF]
                vals[j] = x1 * co[j] - x2 * si[j]
                vals[j + HALF] = x2 * co[j] + x1 * si[j]
        if s < Hq:
            for j in range(NV):
                q_out[U32(t), U32(s), U32(lane + 32 * j)] = vals[j]
            return
        if write_pages == 0:
            for j in range(NV):
                kv_out[U32(plane), U32(t), U32(h), U32(lane + 32 * j)] = vals[j]
            return
        if page < 0:  # the host maps every position before the launch; a kernel cannot raise
            return
        tbuf = cuda.shared.array((WARPS, ROW), np.float32)[cuda.threadIdx.x // 32]  # [D]: this warp's row
        if plane == 0:
            append_row(k_fmt, vals, gscale[0, U32(h)], U32(page), U32(p - lp * P), k_codes, k_scales, lane, tbuf)
        else:
            append_row(v_fmt, vals, gscale[1, U32(h)], U32(page), U32(p - lp * P), v_codes, v_scales, lane, tbuf)

    return qkv_rope_append


@cuda_kernel
def kv_amax_kernel(kv, pos, part):
    """part[plane, h, b] = max |kv[plane, t, h, :]| over token slice b of the chunk's pos[1] valid
    rows (inf when a value is not finite; a padded pass has more rows than that). A grid of
    (2 H, slices) blocks: one block per (plane, head) reading all the rows took 3.3 ms per
    8192-token chunk on the H200 (26 of the 76 ms of GPU time of a 32k nvfp4 prefill), and 64
    slices (1024 warps for the bundled model, an eighth of the GPU, 32 rows each) still ~55 us."""
    H, D, nb = kv.shape[2], kv.shape[3], part.shape[2]
    plane, h, b = cuda.blockIdx.x // H, cuda.blockIdx.x % H, cuda.blockIdx.y
    lane, warp = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
    T = min(np.int64(pos[1]), kv.shape[1])
    per = (T + nb - 1) // nb
    m = np.float32(0.0)
    for t in range(b * per + warp, min(T, (b + 1) * per), ROW_WARPS):
        for c in range(lane, D, 32):
            m = max(m, abs_or_inf(kv[plane, t, h, c]))
    for k in (16, 8, 4, 2, 1):
        m = max(m, cuda.shfl_xor_sync(0xFFFFFFFF, m, k))
    w = cuda.shared.array(ROW_WARPS, np.float32)
    if lane == 0:
        w[warp] = m
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        for i in range(1, ROW_WARPS):
            m = max(m, w[i])
        part[plane, h, b] = m


@cuda_kernel
def kv_gscale_kernel(part, two_level, gscale):
    """gscale[plane, h] = global_scale_for(4 max|x|) from kv_amax_kernel's slices where
    two_level[plane], else 1: the same calibration the CPU cache makes from a layer's first chunk.
    A warp per (plane, head): lanes take every 32nd slice, then shuffles."""
    i = cuda.blockIdx.x
    lane = cuda.threadIdx.x
    H = part.shape[1]
    plane, h = i // H, i % H
    m = np.float32(0.0)
    for b in range(lane, part.shape[2], 32):
        m = max(m, part[plane, h, b])
    m = _lanes_max(m, 32)
    if lane == 0:
        gscale[plane, h] = global_scale_for(GSCALE_HEADROOM * m) if two_level[plane] else np.float32(1.0)


@functools.lru_cache(maxsize=None)
def swiglu_kernel(F16: bool):
    """out [T, I] u16 = 16(silu(gate) * up) (bf16, or fp16 when F16), gu [T, 2I] u16 = (gate | up)
    in the same 16-bit type (the gate|up GEMM's output), I even; the kernel takes both as uint32
    words (`launch_swiglu`'s views), a thread two columns: 16-bit loads of one column a thread were
    slower than the float32 input they replaced (33.7 against 31.1 us for 8192 x 1024, H100).
    Columns on grid x, rows on grid y (strided): no per-element index division, which is a
    ~70-instruction 64-bit divide (the flat grid-stride loop took 54 us a call for 8192 x 1024 on
    the H200 at c513766). A thread loads ROWS_IN_FLIGHT rows before it stores: Numba arrays may
    alias, so a load after a store waits for it, and one row at a time was one load latency a row."""
    enc = f16_enc if F16 else bf16_enc
    dec = f16_dec if F16 else bf16_dec

    @cuda.jit(device=True, inline=True)
    def act(g, u):
        return enc(g / (np.float32(1.0) + math.exp(-g)) * u)

    @cuda_kernel
    def swiglu(gu, out):  # gu [T, I] u32 (gate words | up words), out [T, I / 2] u32
        T, n = out.shape
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c < n:
            g = cuda.local.array(ROWS_IN_FLIGHT, np.uint32)
            u = cuda.local.array(ROWS_IN_FLIGHT, np.uint32)
            for t0 in range(cuda.blockIdx.y * ROWS_IN_FLIGHT, T, cuda.gridDim.y * ROWS_IN_FLIGHT):
                for k in range(ROWS_IN_FLIGHT):
                    live = t0 + k < T
                    g[k] = gu[U32(t0 + k), U32(c)] if live else np.uint32(0)
                    u[k] = gu[U32(t0 + k), U32(n + c)] if live else np.uint32(0)
                for k in range(ROWS_IN_FLIGHT):
                    if t0 + k < T:
                        lo = act(dec(np.uint16(g[k] & 0xFFFF)), dec(np.uint16(u[k] & 0xFFFF)))
                        hi = act(dec(np.uint16(g[k] >> 16)), dec(np.uint16(u[k] >> 16)))
                        out[U32(t0 + k), U32(c)] = np.uint32(lo) | (np.uint32(hi) << np.uint32(16))

    return swiglu


@cuda_kernel
def add_bias_kernel(y, b):
    """y [T, n] f32 += b [n]; laid out as swiglu_kernel (no per-element division, loads first)."""
    T, n = y.shape
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if c < n:
        bc = b[c]
        v = cuda.local.array(ROWS_IN_FLIGHT, np.float32)
        for t0 in range(cuda.blockIdx.y * ROWS_IN_FLIGHT, T, cuda.gridDim.y * ROWS_IN_FLIGHT):
            for k in range(ROWS_IN_FLIGHT):
                v[k] = y[t0 + k, c] if t0 + k < T else np.float32(0.0)
            for k in range(ROWS_IN_FLIGHT):
                if t0 + k < T:
                    y[t0 + k, c] = v[k] + bc


# ==================================================================================== launchers
def _grid_rows(T: int, n: int, threads: int = 256) -> tuple:
    """(column blocks, row blocks) of a [T, n] elementwise kernel, each block striding over rows: at
    most ~2048 blocks (about two resident waves on an H200). A block per row (8192 x 4 blocks for
    a 8192-row swiglu) took 66 us a call on the H200 at 2cbb620, against ~25 us for its bytes."""
    cols = max(1, -(-n // threads))
    return cols, max(1, min(-(-T // ROWS_IN_FLIGHT), 2048 // cols))


# f16: the checkpoint's 16-bit type is fp16 (else bf16), for the launchers that read or write it
def launch_embed(tokens, table, x, stream, f16: bool = False):
    embed_kernel(f16)[x.shape[0], ROW_THREADS, stream](tokens, table, x)


def launch_rms_norm(x, w, eps, out, stream, f16: bool = False):
    R, vpl = rms_norm_shape(x.shape[1])
    threads = max(R, ROW_THREADS)
    rms_norm_kernel(R, vpl, f16)[-(-x.shape[0] // (threads // R)), threads, stream](x, w, np.float32(eps), out)


def launch_qkv_rope_append(qkv, bias, q_norm, k_norm, cos, sin, pos, eps, q_out, kv_out,
                           k, v, gscale, write_pages: bool, stream, f16: bool = False):
    """k, v: (fmt id, table [H, max_pages], codes, scales) of the layer's K and V pools; qkv u16
    bits of bf16 (fp16 when f16)."""
    T, D = qkv.shape[0], q_out.shape[2]
    S = q_out.shape[1] + 2 * kv_out.shape[2]
    if D > MAX_HEAD_DIM or D % 64:
        raise ValueError(f"the CUDA backend supports head_dim a multiple of 64 up to {MAX_HEAD_DIM}")
    qkv_rope_append_kernel(D // 32, f16)[(T, -(-S // WARPS)), 32 * WARPS, stream](
        qkv, bias, q_norm, k_norm, cos, sin, pos, np.float32(eps), q_out, kv_out, *k, *v, gscale,
        1 if write_pages else 0)


def launch_kv_gscale(kv, pos, two_level, gscale, part, stream):
    """gscale [2, H] from the first pos[1] rows of kv [2, T_max, H, D] (pos: int32 device array, the
    chunk's (first position, valid tokens)); part [2, H, slices] f32 scratch (GSCALE_SLICES)."""
    kv_amax_kernel[(2 * kv.shape[2], part.shape[2]), ROW_THREADS, stream](kv, pos, part)
    kv_gscale_kernel[2 * kv.shape[2], 32, stream](part, two_level, gscale)


def launch_swiglu(gu, out, stream, f16: bool = False):
    """gu [T, 2I] u16, out [T, I] u16, I even (the CUDA backend refuses other models)."""
    if out.shape[1] % 2 or gu.shape != (out.shape[0], 2 * out.shape[1]):
        raise ValueError(f"swiglu: gu [T, 2I] and out [T, I] with I even, got {gu.shape} and {out.shape}")
    g32, o32 = gu.view(np.uint32), out.view(np.uint32)
    swiglu_kernel(f16)[_grid_rows(*o32.shape), 256, stream](g32, o32)


def launch_add_bias(y, b, stream):
    add_bias_kernel[_grid_rows(*y.shape), 256, stream](y, b)


# ==================================================================================== PTX check
def _sigs():
    out = [
        (embed_kernel(False), "void(int32[::1], uint16[:,::1], float32[:,::1])"),
        (embed_kernel(True), "void(int32[::1], uint16[:,::1], float32[:,::1])"),
        (rms_norm_kernel(32, 12), "void(float32[:,::1], float32[::1], float32, uint16[:,::1])"),
        (rms_norm_kernel(256, 16, True), "void(float32[:,::1], float32[::1], float32, uint16[:,::1])"),
        (kv_amax_kernel, "void(float32[:,:,:,::1], int32[::1], float32[:,:,::1])"),
        (kv_gscale_kernel, "void(float32[:,:,::1], int32[::1], float32[:,::1])"),
        (swiglu_kernel(False), "void(uint32[:,::1], uint32[:,::1])"),
        (swiglu_kernel(True), "void(uint32[:,::1], uint32[:,::1])"),
        (add_bias_kernel, "void(float32[:,::1], float32[::1])"),
    ]
    pools = {"bf16": "uint16[:,:,::1], uint8[:,:,::1]", "int8": "int8[:,:,::1], float32[:,:,::1]",
             "nvfp4": "uint8[:,:,::1], uint8[:,:,::1]"}
    for k, v, nv, f16 in (("nvfp4", "int8", 4, False), ("bf16", "nvfp4", 2, True), ("int8", "bf16", 8, False)):
        out.append((qkv_rope_append_kernel(nv, f16),
                    "void(uint16[:,::1], float32[::1], float32[::1], float32[::1], float32[:,::1], "
                    "float32[:,::1], int32[::1], float32, float32[:,:,::1], float32[:,:,:,::1], "
                    f"int64, int32[:,::1], {pools[k]}, int64, int32[:,::1], {pools[v]}, "
                    "float32[:,::1], int64)"))
    return out


PTX_SIGNATURES = _sigs()
