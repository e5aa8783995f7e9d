"""The per-token kernels of the CUDA forward pass, each beside its numpy reference.

Dtypes: the residual stream, GEMM outputs, q and attention outputs are float32; a row that feeds a
GEMM is rounded once to bf16 (uint16 bits, round to nearest even) because cuBLAS reads bf16 x bf16
(fp32 accumulate) against the checkpoint's bf16 weights. Norm weights are float32.

  embed_kernel          x[t] = bf16 row tokens[t] of the table                  [T, dim] f32
  rms_norm_kernel       h = bf16(x / rms(x) * w)                                [T, dim] u16
  qkv_rope_append_kernel  per (token, head): + bias, q/k RMSNorm (Qwen3), RoPE; q -> q_out;
                        K/V quantized straight into the layer's pages (write_pages=1), or
                        written as fp32 to kv_out (the first chunk, for the 4-bit scales)
  kv_amax_kernel, kv_gscale_kernel  second-level scale of each (K/V, head) from a chunk's
                        max |x| (maxima of token slices, then one per (K/V, head))
  swiglu_kernel         a = bf16(silu(gate) * up)                               [T, inter] u16
  to_bf16_kernel, add_bias_kernel
The references (`*_ref`) are the spec the tests hold the kernels to; the CPU model
(runtime/model.py) computes the same math in float32 without the bf16 roundings.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from coldkv.numba_kernels.fp import bf16_dec, bf16_enc, global_scale_for, int8_enc
from coldkv.numba_kernels.quant import (BF16, INT8, abs_or_inf, encode_pair, group_mult, group_scale,
                                        int8_row_scale, ref_bf16_decode, ref_bf16_encode)

ROW_THREADS = 128  # threads a block for the row kernels
ROW_WARPS = 4  # = ROW_THREADS // 32 (array shapes in kernels must be plain constants)
WARPS = 4  # warps per block of the per-(token, head) kernel
MAX_HEAD_DIM = 256
MAX_VPL = 8  # values per lane of a head row = MAX_HEAD_DIM // 32
GSCALE_HEADROOM = np.float32(4.0)  # calibration: g = global_scale_for(4 max|x|), CPU cache too
GSCALE_SLICES = 64  # token slices per (K/V, head) whose maxima kv_amax_kernel finds in parallel


# ==================================================================================== references
def rms_norm_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x [T, n] f32, w [n] f32 -> bf16 bits [T, n] of x / sqrt(mean(x^2) + eps) * w."""
    var = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    return ref_bf16_encode((x / np.sqrt(var + eps) * w).astype(np.float32))


def qkv_post_ref(qkv, bias, q_norm, k_norm, cos, sin, pos0: int, eps: float, nq: int, nkv: int):
    """qkv [T, (nq + 2 nkv) D] f32 -> q [T, nq, D], k [T, nkv, D], v [T, nkv, D] float32:
    bias, then q/k RMSNorm (when given), then RoPE (rotate_half layout) at positions pos0.."""
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


def swiglu_ref(gu: np.ndarray) -> np.ndarray:
    """gu [T, 2 I] f32 (gate | up) -> bf16 bits [T, I] of silu(gate) * up."""
    n = gu.shape[1] // 2
    g = gu[:, :n].astype(np.float64)
    return ref_bf16_encode((g / (1 + np.exp(-g)) * gu[:, n:]).astype(np.float32))


def embed_ref(tokens: np.ndarray, table16: np.ndarray) -> np.ndarray:
    return ref_bf16_decode(table16[tokens])


# ==================================================================================== kernels
@cuda.jit
def embed_kernel(tokens, table, x):
    """x [T, dim] f32 = bf16 rows tokens[t] of table [V, dim] u16."""
    t = cuda.blockIdx.x
    tok = tokens[t]
    for c in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
        x[t, c] = bf16_dec(table[tok, c])


@cuda.jit(device=True)
def _warp_sum(v):
    for m in (16, 8, 4, 2, 1):
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, m)
    return v


@cuda.jit(device=True, inline=True)
def _lanes_max(v, lanes):
    """Max of v over aligned groups of `lanes` (16 or 32) lanes."""
    o = lanes // 2
    while o > 0:
        v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, o))
        o //= 2
    return v


@cuda.jit
def rms_norm_kernel(x, w, eps, out):
    """out [T, n] u16 = bf16(x / sqrt(mean(x^2) + eps) * w); one warp per row, ROW_WARPS rows a
    block: the sum of squares by shuffles, no shared memory or barrier (a block per row took
    22 us a call for 8192 x 384 on the H200, ~1.4 ms of a 32k prefill)."""
    row = cuda.blockIdx.x * ROW_WARPS + cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    T, n = x.shape
    if row >= T:  # the whole warp leaves: its shuffles below are warp-uniform
        return
    ss = np.float32(0.0)
    for c in range(lane, n, 32):
        v = x[row, c]
        ss += v * v
    ss = _warp_sum(ss)
    inv = np.float32(1.0) / math.sqrt(ss / np.float32(n) + np.float32(eps))
    for c in range(lane, n, 32):
        out[row, c] = bf16_enc(x[row, c] * inv * w[c])


@cuda.jit(device=True)
def _append_row(fmt, vals, nv, g, table, h, p, codes, scales, lane):
    """Append the warp's row (lane's value slot j = column lane + 32 j) at position p of kv head h
    in a hot format. Every lane encodes its own values with the CPU kernel's scalar cores
    (quant.quantize_chunk's, so the pages are bit-identical); a group's max comes from shuffles
    over its lanes: 16 lanes of one slot for the 4-bit formats, the warp for int8's row. (It was a
    lane per group / per int8 row through shared memory: 8 busy lanes at d 128, one for int8.)"""
    P = codes.shape[1]
    page = table[h, p // P]
    if page < 0:  # the host maps every position before the launch; a kernel cannot raise
        return
    row = p % P
    if fmt == BF16:
        for j in range(MAX_VPL):
            if j < nv:
                codes[page, row, lane + 32 * j] = bf16_enc(vals[j])
        return
    if fmt == INT8:  # one scale for the row
        amax = np.float32(0.0)
        for j in range(MAX_VPL):
            if j < nv:
                amax = max(amax, abs_or_inf(vals[j]))
        amax = _lanes_max(amax, 32)
        scale, inv = int8_row_scale(amax)
        if lane == 0:
            scales[page, row, 0] = scale
        for j in range(MAX_VPL):
            if j < nv:
                codes[page, row, lane + 32 * j] = int8_enc(vals[j], inv) if inv > np.float32(0.0) else 0
        return
    for j in range(MAX_VPL):  # nvfp4 / iso3: lanes 16 k .. 16 k + 15 of slot j hold group 2 j + k
        if j < nv:
            x = vals[j]
            amax = _lanes_max(abs_or_inf(x), 16)
            sb = group_scale(fmt, amax, g)
            x1 = cuda.shfl_down_sync(0xFFFFFFFF, x, 1)  # the odd column's value, for the even lane
            c = lane + 32 * j
            if lane % 16 == 0:
                scales[page, row, c >> 4] = sb
            if lane % 2 == 0:
                codes[page, row, c >> 1] = encode_pair(fmt, x, x1, group_mult(sb, g), sb)


@cuda.jit(device=True)
def _rot(vals, j, k, cos, sin, p, lane):
    """RoPE of the lane's value slots j (column lane + 32 j) and k (its partner, + D/2)."""
    c = lane + 32 * j
    co = cos[p, c]
    si = sin[p, c]
    x1 = vals[j]
    x2 = vals[k]
    vals[j] = x1 * co - x2 * si
    vals[k] = x2 * co + x1 * si


@cuda.jit
def qkv_rope_append_kernel(qkv, bias, q_norm, k_norm, cos, sin, pos, eps, q_out, kv_out,
                           k_fmt, k_table, k_codes, k_scales, v_fmt, v_table, v_codes, v_scales,
                           gscale, write_pages):
    """A warp per (token t, head slot s): slots [0, Hq) are q heads, then Hq..Hq+H-1 K, then V.

    qkv [T, (Hq + 2H) D] f32 (the fused QKV GEMM's output); bias [(Hq + 2H) D] or empty;
    q_norm/k_norm [D] or empty; cos/sin [positions, D/2]; pos int32 device: pos[0] the chunk's first
    position (device-resident so a captured graph serves every decode step); q_out [T, Hq, D];
    kv_out [2, T_max, H, D] fp32 scratch; K/V tables [H, max_pages]; gscale [2, H].
    Lane j-th value is column lane + 32 j, so RoPE's partner column (c + D/2) is in the same lane.
    """
    T = qkv.shape[0]
    Hq, D = q_out.shape[1], q_out.shape[2]
    H = kv_out.shape[2]
    S = Hq + 2 * H
    lane = cuda.threadIdx.x % 32
    warp = cuda.blockIdx.x * WARPS + cuda.threadIdx.x // 32
    if warp >= T * S:
        return  # whole warps only: the grid is rounded up to blocks
    t = warp // S
    s = warp % S
    nv = D // 32
    vals = cuda.local.array(MAX_VPL, np.float32)
    has_bias = bias.shape[0] > 0
    for j in range(MAX_VPL):
        if j < nv:
            c = s * D + lane + 32 * j
            v = qkv[t, c]
            if has_bias:
                v += bias[c]
            vals[j] = v
    p = pos[0] + t
    if s < Hq + H:
        if q_norm.shape[0] > 0:
            ss = np.float32(0.0)
            for j in range(MAX_VPL):
                if j < nv:
                    ss += vals[j] * vals[j]
            inv = np.float32(1.0) / math.sqrt(_warp_sum(ss) / np.float32(D) + np.float32(eps))
            for j in range(MAX_VPL):
                if j < nv:
                    c = lane + 32 * j
                    vals[j] = vals[j] * inv * (q_norm[c] if s < Hq else k_norm[c])
        # RoPE pairs value slot j with j + nv / 2, spelled out per head_dim: a variable index
        # would keep `vals` in local memory (ptxas: a 32-byte stack frame, ~50 ld/st.local)
        if nv == 2:
            _rot(vals, 0, 1, cos, sin, p, lane)
        elif nv == 4:
            _rot(vals, 0, 2, cos, sin, p, lane)
            _rot(vals, 1, 3, cos, sin, p, lane)
        elif nv == 6:
            _rot(vals, 0, 3, cos, sin, p, lane)
            _rot(vals, 1, 4, cos, sin, p, lane)
            _rot(vals, 2, 5, cos, sin, p, lane)
        else:
            _rot(vals, 0, 4, cos, sin, p, lane)
            _rot(vals, 1, 5, cos, sin, p, lane)
            _rot(vals, 2, 6, cos, sin, p, lane)
            _rot(vals, 3, 7, cos, sin, p, lane)
    if s < Hq:
        for j in range(MAX_VPL):
            if j < nv:
                q_out[t, s, lane + 32 * j] = vals[j]
        return
    plane = 0 if s < Hq + H else 1
    h = (s - Hq) % H
    if write_pages == 0:
        for j in range(MAX_VPL):
            if j < nv:
                kv_out[plane, t, h, lane + 32 * j] = vals[j]
        return
    if plane == 0:
        _append_row(k_fmt, vals, nv, gscale[0, h], k_table, h, p, k_codes, k_scales, lane)
    else:
        _append_row(v_fmt, vals, nv, gscale[1, h], v_table, h, p, v_codes, v_scales, lane)


@cuda.jit
def kv_amax_kernel(kv, pos, part):
    """part[plane, h, b] = max |kv[plane, t, h, :]| over token slice b of the chunk's pos[1] valid
    rows (inf when a value is not finite; a padded pass has more rows than that). A grid of
    (2 H, slices) blocks: one block per (plane, head) reading all the rows took 3.3 ms per
    8192-token chunk on the H200 (26 of the 76 ms of GPU time of a 32k nvfp4 prefill)."""
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


@cuda.jit
def kv_gscale_kernel(part, two_level, gscale):
    """gscale[plane, h] = global_scale_for(4 max|x|) from kv_amax_kernel's slices where
    two_level[plane], else 1: the same calibration the CPU cache makes from a layer's first chunk."""
    i = cuda.grid(1)
    H = part.shape[1]
    if i >= 2 * H:
        return
    plane, h = i // H, i % H
    m = np.float32(0.0)
    for b in range(part.shape[2]):
        m = max(m, part[plane, h, b])
    gscale[plane, h] = global_scale_for(GSCALE_HEADROOM * m) if two_level[plane] else np.float32(1.0)


@cuda.jit
def swiglu_kernel(gu, out):
    """out [T, I] u16 = bf16(silu(gate) * up), gu [T, 2I] f32 = (gate | up). Columns on grid x,
    rows on grid y (strided): no per-element index division, which is a ~70-instruction 64-bit
    divide (the flat grid-stride loop took 54 us a call for 8192 x 1024 on the H200 at c513766)."""
    T, n = out.shape
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if c < n:
        for t in range(cuda.blockIdx.y, T, cuda.gridDim.y):
            g = gu[t, c]
            out[t, c] = bf16_enc(g / (np.float32(1.0) + math.exp(-g)) * gu[t, n + c])


@cuda.jit
def to_bf16_kernel(x, out):
    """out [n] u16 = bf16(x [n] f32)."""
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        out[i] = bf16_enc(x[i])


@cuda.jit
def add_bias_kernel(y, b):
    """y [T, n] f32 += b [n]; laid out as swiglu_kernel (no per-element division)."""
    T, n = y.shape
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if c < n:
        bc = b[c]
        for t in range(cuda.blockIdx.y, T, cuda.gridDim.y):
            y[t, c] += bc


# ==================================================================================== launchers
def _blocks(n: int, threads: int = 256, cap: int = 1024) -> int:
    return max(1, min(cap, -(-n // threads)))


def _grid_rows(T: int, n: int, threads: int = 256) -> tuple:
    """(column blocks, row blocks) of a [T, n] elementwise kernel, each block striding over rows: at
    most ~2048 blocks (about two resident waves on an H200). A block per row (8192 x 4 blocks for
    a 8192-row swiglu) took 66 us a call on the H200 at 2cbb620, against ~25 us for its bytes."""
    cols = max(1, -(-n // threads))
    return cols, max(1, min(T, 2048 // cols))


def launch_embed(tokens, table, x, stream):
    embed_kernel[x.shape[0], ROW_THREADS, stream](tokens, table, x)


def launch_rms_norm(x, w, eps, out, stream):
    rms_norm_kernel[-(-x.shape[0] // ROW_WARPS), ROW_THREADS, stream](x, w, np.float32(eps), out)


def launch_qkv_rope_append(qkv, bias, q_norm, k_norm, cos, sin, pos, eps, q_out, kv_out,
                           k, v, gscale, write_pages: bool, stream):
    """k, v: (fmt id, table [H, max_pages], codes, scales) of the layer's K and V pools."""
    T = qkv.shape[0]
    S = q_out.shape[1] + 2 * kv_out.shape[2]
    if q_out.shape[2] > MAX_HEAD_DIM or q_out.shape[2] % 64:
        raise ValueError(f"the CUDA backend supports head_dim a multiple of 64 up to {MAX_HEAD_DIM}")
    qkv_rope_append_kernel[-(-T * S // WARPS), 32 * WARPS, stream](
        qkv, bias, q_norm, k_norm, cos, sin, pos, np.float32(eps), q_out, kv_out, *k, *v, gscale,
        1 if write_pages else 0)


def launch_kv_gscale(kv, pos, two_level, gscale, part, stream):
    """gscale [2, H] from the first pos[1] rows of kv [2, T_max, H, D] (pos: int32 device array, the
    chunk's (first position, valid tokens)); part [2, H, slices] f32 scratch (GSCALE_SLICES)."""
    kv_amax_kernel[(2 * kv.shape[2], part.shape[2]), ROW_THREADS, stream](kv, pos, part)
    kv_gscale_kernel[1, 32 * -(-2 * kv.shape[2] // 32), stream](part, two_level, gscale)


def launch_swiglu(gu, out, stream):
    swiglu_kernel[_grid_rows(*out.shape), 256, stream](gu, out)


def launch_to_bf16(x, out, stream):
    to_bf16_kernel[_blocks(x.shape[0]), 256, stream](x, out)


def launch_add_bias(y, b, stream):
    add_bias_kernel[_grid_rows(*y.shape), 256, stream](y, b)


# ==================================================================================== PTX check
def _sigs():
    out = [
        (embed_kernel, "void(int32[::1], uint16[:,::1], float32[:,::1])"),
        (rms_norm_kernel, "void(float32[:,::1], float32[::1], float32, uint16[:,::1])"),
        (kv_amax_kernel, "void(float32[:,:,:,::1], int32[::1], float32[:,:,::1])"),
        (kv_gscale_kernel, "void(float32[:,:,::1], int32[::1], float32[:,::1])"),
        (swiglu_kernel, "void(float32[:,::1], uint16[:,::1])"),
        (to_bf16_kernel, "void(float32[::1], uint16[::1])"),
        (add_bias_kernel, "void(float32[:,::1], float32[::1])"),
    ]
    pools = {"bf16": "uint16[:,:,::1], uint8[:,:,::1]", "int8": "int8[:,:,::1], float32[:,:,::1]",
             "nvfp4": "uint8[:,:,::1], uint8[:,:,::1]"}
    for k, v in (("nvfp4", "int8"), ("bf16", "nvfp4"), ("int8", "bf16")):
        out.append((qkv_rope_append_kernel,
                    "void(float32[:,::1], float32[::1], float32[::1], float32[::1], float32[:,::1], "
                    "float32[:,::1], int32[::1], float32, float32[:,:,::1], float32[:,:,:,::1], "
                    f"int64, int32[:,::1], {pools[k]}, int64, int32[:,::1], {pools[v]}, "
                    "float32[:,::1], int64)"))
    return out


PTX_SIGNATURES = _sigs()
