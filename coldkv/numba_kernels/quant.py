"""KV page codecs: numpy reference (the spec), njit CPU kernels, CUDA kernels.

Formats (docs/formats.md has the byte layouts and the measurements):
  bf16   codes uint16 bf16 bits                                       no scales
  int8   codes int8 (symmetric, RNE, +-127)                           fp32 scale per token row
  nvfp4  codes E2M1, two per byte (element 2i in the low nibble)      E4M3 byte per 16 values
  iso3   codes sign + 3-bit magnitude m (value = +-m * s / g)         E4M3 byte per 16 values
  c4g64  codes E2M1 as nvfp4                                          E4M3 byte per 64 values
The 4-bit formats also have an fp32 second-level scale g (per layer and head for the hot pool,
per head-page for c4g64 cold pages): see fp.global_scale_for.

Page layout of a pool (one per layer and plane kind, DEVELOPERS.md):
  codes  [n_pages, page_tokens, code_cols]     scales [n_pages, page_tokens, scale_cols]
A page row is one token's head_dim vector, so a Packed block of `page_tokens` tokens is exactly
`codes[page]`, `scales[page]`.

Quantization, per group of values x (16 for nvfp4/iso3, 64 for c4g64, a row for int8), float32:
  nvfp4/c4g64: sb = e4m3(min(g * max|x| / 6, 448)); s = e4m3_dec(sb); r = g / s (0 if s == 0)
               code = e2m1(x * r);                      value = e2m1_dec(code) * (s / g)
  iso3:        sb = e4m3(min(g * max|x| / 7, 448));     r as above
               code = sign(x) | RNE(min(|x| * r, 7));  value = +-m * (s / g)
  int8:        scale = max|x| / 127; inv = 127 / max|x| (0 if 0)
               code = RNE(clamp(x * inv, +-127));       value = code * scale
  bf16:        RNE of the fp32 bits.
Non-finite input: the numpy API (coldkv.codecs.quantize) refuses it. Kernels cannot raise, so a
group holding a NaN or inf is stored as "poisoned": E4M3 scale 0x7F (NaN) / int8 scale NaN with
zero codes, and decodes to NaN for the whole group; bf16 keeps inf and NaN per value. A bad input
therefore shows up as NaN, never as a plausible wrong number.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, njit
from numba.extending import register_jitable

from coldkv.numba_kernels.fp import (
    E4M3_MAX,
    E4M3_NAN,
    F32_MAX,
    bf16_dec,
    bf16_enc,
    bits_f32,
    e2m1_dec,
    e2m1_enc,
    e4m3_dec,
    e4m3_enc,
    global_scale_for,
    int8_enc,
    iso3_dec,
    iso3_enc,
)

FORMAT_IDS = {"bf16": 0, "int8": 1, "nvfp4": 2, "iso3": 3, "c4g64": 4}
FORMAT_NAMES = {v: k for k, v in FORMAT_IDS.items()}
BF16, INT8, NVFP4, ISO3, C4G64 = 0, 1, 2, 3, 4

# fmt id -> (codes dtype, scales dtype); the same as coldkv.codecs.packed.FORMATS.
DTYPES = {
    BF16: (np.uint16, np.uint8),  # zero scale columns
    INT8: (np.int8, np.float32),
    NVFP4: (np.uint8, np.uint8),
    ISO3: (np.uint8, np.uint8),
    C4G64: (np.uint8, np.uint8),
}

__all__ = [
    "FORMAT_IDS", "FORMAT_NAMES", "DTYPES", "group_size", "code_cols", "scale_cols", "pool_arrays",
    "global_scale_for", "ref_e2m1_encode", "ref_e2m1_decode", "ref_e4m3_encode", "ref_e4m3_decode",
    "ref_bf16_encode", "ref_bf16_decode", "ref_quantize", "ref_dequantize", "ref_requantize",
    "quantize_chunk", "dequantize_chunk", "decode_value",
    "append_cpu", "dequant_rows_cpu", "requant_c4g64_cpu",
    "append_cuda", "dequant_pages_cuda", "requant_c4g64_cuda",
    "launch_append", "launch_dequant_pages", "launch_requant_c4g64", "PTX_SIGNATURES",
]


# ================================================================================== layout
def group_size(fmt_id: int, head_dim: int) -> int:
    """Values per scale: 16 (nvfp4, iso3), 64 (c4g64), head_dim (int8 row), 0 (bf16)."""
    return {BF16: 0, INT8: head_dim, NVFP4: 16, ISO3: 16, C4G64: 64}[fmt_id]


def code_cols(fmt_id: int, head_dim: int) -> int:
    return head_dim if fmt_id in (BF16, INT8) else head_dim // 2


def scale_cols(fmt_id: int, head_dim: int) -> int:
    g = group_size(fmt_id, head_dim)
    return 0 if g == 0 else head_dim // g


def pool_arrays(fmt, n_pages: int, page_tokens: int, head_dim: int):
    """Zeroed (codes [n_pages, page_tokens, code_cols], scales [n_pages, page_tokens, scale_cols])."""
    fmt_id = FORMAT_IDS[fmt] if isinstance(fmt, str) else int(fmt)
    if head_dim % 64:
        raise ValueError(f"pool head_dim must be a multiple of 64 (kernels use 16/64 groups), got {head_dim}")
    cdt, sdt = DTYPES[fmt_id]
    codes = np.zeros((n_pages, page_tokens, code_cols(fmt_id, head_dim)), cdt)
    scales = np.zeros((n_pages, page_tokens, scale_cols(fmt_id, head_dim)), sdt)
    return codes, scales


# ================================================================================== reference
# Vectorised numpy, written from the format definitions (not from the scalar cores). This is the
# spec: the scalar cores, njit kernels and CUDA kernels must match it bit for bit.
_E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def ref_e2m1_encode(v: np.ndarray) -> np.ndarray:
    """float32 -> E2M1 codes (uint8 0..15), RNE, saturating. Ties go to the even code."""
    v = np.asarray(v, np.float32)
    a = np.abs(v)
    # midpoint k sits between magnitudes k and k+1; a tie rounds up only when k+1 is even.
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    m = np.zeros(v.shape, np.uint8)
    for k, mid in enumerate(mids):
        m += ((a > mid) | ((a == mid) & (k % 2 == 1))).astype(np.uint8)
    return m | (np.signbit(v).astype(np.uint8) << 3)


def ref_e2m1_decode(c: np.ndarray) -> np.ndarray:
    return _E2M1_VALUES[np.asarray(c) & 15]


def _e4m3_table() -> np.ndarray:
    t = np.empty(256, np.float32)
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        mag = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        t[c] = np.nan if (c & 0x7F) == 0x7F else (-mag if c & 0x80 else mag)
    return t


_E4M3_VALUES = _e4m3_table()
_E4M3_POS = _E4M3_VALUES[:127].astype(np.float64)  # 0 .. 448, increasing


def ref_e4m3_encode(v: np.ndarray) -> np.ndarray:
    """float32 -> E4M3fn bytes, RNE, saturating at +-448 (input must be finite or inf)."""
    v = np.asarray(v, np.float32)
    a = np.minimum(np.abs(v).astype(np.float64), 448.0)
    # nearest of the 127 magnitudes; ties (exact midpoints) to the even code.
    hi = np.clip(np.searchsorted(_E4M3_POS, a, side="left"), 1, 126)
    lo = hi - 1
    dlo, dhi = a - _E4M3_POS[lo], _E4M3_POS[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (code.astype(np.uint8)) | (np.signbit(v).astype(np.uint8) << 7)


def ref_e4m3_decode(b: np.ndarray) -> np.ndarray:
    return _E4M3_VALUES[np.asarray(b, np.uint8)]


def ref_bf16_encode(v: np.ndarray) -> np.ndarray:
    b = np.asarray(v, np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(v, np.float32))
    return np.where(nan, ((b >> 16) | 0x40).astype(np.uint16), r)


def ref_bf16_decode(h: np.ndarray) -> np.ndarray:
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32)


def _f32(x) -> np.float32:
    return np.float32(x)


def ref_quantize(x: np.ndarray, fmt_id: int, g=1.0):
    """x float32 [T, D] -> (codes [T, code_cols], scales [T, scale_cols]).

    A group (int8: row) holding NaN or inf is poisoned: NaN scale, zero codes (module docstring).
    """
    x = np.asarray(x, np.float32)
    T, D = x.shape
    g = _f32(g)
    if fmt_id == BF16:
        return ref_bf16_encode(x), np.zeros((T, 0), np.uint8)
    G = D if fmt_id == INT8 else (64 if fmt_id == C4G64 else 16)
    bad = ~np.isfinite(x).reshape(T, D // G, G).all(axis=2)  # [T, D/G]
    x = np.where(np.isfinite(x), x, _f32(0))
    if fmt_id == INT8:
        amax = np.abs(x).max(axis=1, initial=np.float32(0))  # [T]
        scale = np.where(bad[:, 0], _f32(np.nan), amax / _f32(127))
        safe = np.where(amax > 0, amax, _f32(1))
        inv = np.where((amax > 0) & ~bad[:, 0], _f32(127) / safe, _f32(0)).astype(np.float32)
        q = np.rint(np.clip(x * inv[:, None], _f32(-127), _f32(127)))
        return q.astype(np.int8), scale.astype(np.float32)[:, None]
    xg = x.reshape(T, D // G, G)
    bmax = np.abs(xg).max(axis=2)  # [T, D/G]
    div = _f32(7) if fmt_id == ISO3 else _f32(6)
    sb = ref_e4m3_encode(np.minimum((g * bmax) / div, E4M3_MAX))
    sb[bad] = E4M3_NAN
    s = ref_e4m3_decode(sb)
    r = np.divide(g, s, out=np.zeros_like(s), where=s > 0)[:, :, None]  # [T, D/G, 1]
    if fmt_id == ISO3:
        m = np.rint(np.minimum(np.abs(xg) * r, _f32(7))).astype(np.uint8)
        c = m | (np.signbit(xg).astype(np.uint8) << 3)
    else:
        c = ref_e2m1_encode(xg * r)
    c[bad] = 0
    c = c.reshape(T, D)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8), sb


def ref_dequantize(codes: np.ndarray, scales: np.ndarray, fmt_id: int, g, head_dim: int) -> np.ndarray:
    """(codes [T, code_cols], scales [T, scale_cols]) -> float32 [T, head_dim]."""
    T = codes.shape[0]
    if fmt_id == BF16:
        return ref_bf16_decode(codes)
    if fmt_id == INT8:
        return codes.astype(np.float32) * scales.reshape(T, 1).astype(np.float32)
    G = 64 if fmt_id == C4G64 else 16
    c = np.empty((T, head_dim), np.uint8)
    c[:, 0::2], c[:, 1::2] = codes & 15, codes >> 4
    if fmt_id == ISO3:
        v = (c & 7).astype(np.float32) * np.where(c & 8, _f32(-1), _f32(1))
    else:
        v = ref_e2m1_decode(c)
    d = ref_e4m3_decode(scales) / _f32(g)  # [T, D/G] step of each group
    return (v.reshape(T, head_dim // G, G) * d[:, :, None]).reshape(T, head_dim)


def ref_requantize(codes, scales, fmt_id: int, g, head_dim: int, to: int = C4G64):
    """Decode a page and re-encode it; the new global scale comes from the page's finite amax."""
    x = ref_dequantize(codes, scales, fmt_id, g, head_dim)
    fin = np.abs(x[np.isfinite(x)])
    g2 = global_scale_for(fin.max() if fin.size else np.float32(0))
    c2, s2 = ref_quantize(x, to, g2)
    return c2, s2, g2


# ================================================================================== jitted cores
# Compiled for njit and for CUDA (register_jitable). `src`, `out` are 1-D float32 arrays.
@register_jitable
def abs_or_inf(v):
    """|v|, with NaN and inf both mapped to +inf so a plain max() carries "this group is bad"."""
    a = abs(np.float32(v))
    return a if a <= F32_MAX else np.float32(np.inf)


@register_jitable
def group_scale(fmt, amax, g):
    """4-bit formats: E4M3 scale byte of a group with max |x| = amax (inf: poisoned, 0x7F)."""
    if not (amax <= F32_MAX):
        return E4M3_NAN
    div = np.float32(7.0) if fmt == 3 else np.float32(6.0)
    return e4m3_enc(min(np.float32(g) * amax / div, E4M3_MAX))


@register_jitable
def group_mult(sb, g):
    """4-bit formats: r = g / s multiplies values into code units (0 for a zero or NaN scale)."""
    s = e4m3_dec(sb)
    return np.float32(g) / s if s > np.float32(0.0) else np.float32(0.0)


@register_jitable
def encode_pair(fmt, x0, x1, r, sb):
    """4-bit formats: the byte holding x0 (low nibble) and x1 (high nibble)."""
    if sb == E4M3_NAN:
        return 0
    if fmt == 3:
        return iso3_enc(x0, r) | (iso3_enc(x1, r) << 4)
    return e2m1_enc(x0 * r) | (e2m1_enc(x1 * r) << 4)


@register_jitable
def int8_row_scale(amax):
    """int8: (fp32 scale stored per row, multiplier 127 / amax); NaN scale for a poisoned row."""
    if not (amax <= F32_MAX):
        return bits_f32(0x7FC00000), np.float32(0.0)
    inv = np.float32(127.0) / amax if amax > np.float32(0.0) else np.float32(0.0)
    return amax / np.float32(127.0), inv


@register_jitable
def quantize_chunk(fmt, src, s0, n, g, codes, scales, page, row, c0):
    """Quantize src[s0:s0+n] into row `row` of `page`, value columns c0..c0+n-1.

    n must be: one whole group (16 nvfp4/iso3, 64 c4g64, c0 aligned), the whole row for int8
    (c0 = 0), and any even count for bf16.
    """
    if fmt == 0:  # bf16
        for k in range(n):
            codes[page, row, c0 + k] = bf16_enc(src[s0 + k])
        return
    amax = np.float32(0.0)
    for k in range(n):
        amax = max(amax, abs_or_inf(src[s0 + k]))
    if fmt == 1:  # int8: one fp32 scale for the row
        scale, inv = int8_row_scale(amax)
        scales[page, row, 0] = scale
        for k in range(n):
            codes[page, row, c0 + k] = int8_enc(src[s0 + k], inv) if inv > np.float32(0.0) else 0
        return
    sb = group_scale(fmt, amax, g)
    scales[page, row, c0 >> (6 if fmt == 4 else 4)] = sb
    r = group_mult(sb, g)
    for k in range(0, n, 2):
        codes[page, row, (c0 + k) >> 1] = encode_pair(fmt, src[s0 + k], src[s0 + k + 1], r, sb)


@register_jitable
def dequantize_chunk(fmt, codes, scales, page, row, c0, n, g, out, o0):
    """Decode value columns c0..c0+n-1 of one page row into out[o0:o0+n] (c0, n even)."""
    gs = np.float32(g)
    if fmt == 0:
        for k in range(n):
            out[o0 + k] = bf16_dec(codes[page, row, c0 + k])
        return
    if fmt == 1:
        s = np.float32(scales[page, row, 0])
        for k in range(n):
            out[o0 + k] = np.float32(codes[page, row, c0 + k]) * s
        return
    sh = 6 if fmt == 4 else 4  # log2 of the group
    k = 0
    while k < n:
        c = c0 + k
        d = e4m3_dec(np.int64(scales[page, row, c >> sh])) / gs  # the group's step s / g
        end = min(n, k + (1 << sh) - (c & ((1 << sh) - 1)))
        while k < end:
            byte = np.int64(codes[page, row, (c0 + k) >> 1])
            if fmt == 3:
                out[o0 + k] = iso3_dec(byte & 15) * d
                out[o0 + k + 1] = iso3_dec(byte >> 4) * d
            else:
                out[o0 + k] = e2m1_dec(byte & 15) * d
                out[o0 + k + 1] = e2m1_dec(byte >> 4) * d
            k += 2


@register_jitable
def decode_value(fmt, codes, scales, page, row, col, g):
    """One value of a page (for attention kernels that read K/V element-wise)."""
    if fmt == 0:
        return bf16_dec(codes[page, row, col])
    if fmt == 1:
        return np.float32(codes[page, row, col]) * np.float32(scales[page, row, 0])
    d = e4m3_dec(np.int64(scales[page, row, col >> (6 if fmt == 4 else 4)])) / np.float32(g)
    byte = np.int64(codes[page, row, col >> 1])
    c = (byte >> 4) if (col & 1) else (byte & 15)
    return (iso3_dec(c) if fmt == 3 else e2m1_dec(c)) * d


@register_jitable
def _chunk(fmt, head_dim):
    """Values per scale group as the CPU kernels walk a row (int8: the row, bf16: 16)."""
    if fmt == 1:
        return head_dim
    return 64 if fmt == 4 else 16


# ================================================================================== CPU (njit)
@njit(cache=True)
def append_cpu(fmt_id, x, pos0, table, codes, scales, gscale):
    """Quantize-append x [T, H, D] at positions pos0.. into the pages table[h, pos // page_tokens]."""
    T, H, D = x.shape
    P = codes.shape[1]
    n = _chunk(fmt_id, D)
    for t in range(T):
        pos = pos0 + t
        for h in range(H):
            page = table[h, pos // P]
            if page < 0:
                raise ValueError("append_cpu: position maps to an unallocated page")
            xr = x[t, h]
            for c0 in range(0, D, n):
                quantize_chunk(fmt_id, xr, c0, n, gscale[h], codes, scales, page, pos % P, c0)


@njit(cache=True)
def dequant_rows_cpu(fmt_id, codes, scales, page, t0, t1, gscale_h, out):
    """Decode rows t0..t1-1 of one page into out float32 [t1 - t0, D]."""
    D = out.shape[1]
    for t in range(t0, t1):
        dequantize_chunk(fmt_id, codes, scales, page, t, 0, D, gscale_h, out[t - t0], 0)


@njit(cache=True)
def requant_c4g64_cpu(fmt_id, codes, scales, pages, gsrc, out_codes, out_scales, out_g):
    """Requantize pages[i] (global gsrc[i]) to c4g64 in out_*[i], with out_g[i] from the page amax.

    out_codes [n, P, D/2] uint8, out_scales [n, P, D/64] uint8, out_g [n] float32.
    """
    P = codes.shape[1]
    D = out_codes.shape[2] * 2
    buf = np.empty((P, D), np.float32)
    for i in range(pages.shape[0]):
        for t in range(P):
            dequantize_chunk(fmt_id, codes, scales, pages[i], t, 0, D, gsrc[i], buf[t], 0)
        amax = np.float32(0.0)
        for t in range(P):
            for d in range(D):
                a = abs(buf[t, d])
                if a <= F32_MAX and a > amax:
                    amax = a
        g2 = global_scale_for(amax)
        out_g[i] = g2
        for t in range(P):
            for c0 in range(0, D, 64):
                quantize_chunk(4, buf[t], c0, 64, g2, out_codes, out_scales, i, t, c0)


# ================================================================================== CUDA
# Layout of every kernel: one thread per PAIR of values (one code byte of the 4-bit formats), a
# block of 256 threads shaped (D/2, 256 / (D/2)), so a warp reads 256 B of x and writes 32
# consecutive code bytes: coalesced both ways. Group maxima (16, 64 or a whole row) are reduced
# in shared memory by a tree over the group's 8, 32 or D/2 threads; hence D must be a power of
# two (64, 128, 256). The scalar math is the same cores as the CPU kernels.
_THREADS = 256


@cuda.jit(device=True)
def seg_max(smem, tid, v, seg):
    """Max of v over aligned segments of `seg` consecutive threads (seg a power of two).

    Every thread of the block must call it (it synchronises)."""
    smem[tid] = v
    s = 1
    while s < seg:
        cuda.syncthreads()
        if (tid & (2 * s - 1)) == 0:
            smem[tid] = max(smem[tid], smem[tid + s])
        s *= 2
    cuda.syncthreads()
    out = smem[tid & ~(seg - 1)]
    cuda.syncthreads()  # smem is reused by the next call
    return out


@register_jitable
def _seg(fmt, half):
    """Threads (value pairs) per scale group: 8 (nvfp4, iso3), 32 (c4g64), the row (int8)."""
    if fmt == 1:
        return half
    if fmt == 4:
        return 32
    return 8 if fmt != 0 else 1


@cuda.jit(device=True)
def _store_pair(fmt, x0, x1, amax, g, codes, scales, page, row, col):
    """Write the codes of x0, x1 (columns col, col+1) and, from the group's first thread, its scale."""
    if fmt == 0:
        codes[page, row, col] = bf16_enc(x0)
        codes[page, row, col + 1] = bf16_enc(x1)
    elif fmt == 1:
        scale, inv = int8_row_scale(amax)
        if col == 0:
            scales[page, row, 0] = scale
        codes[page, row, col] = int8_enc(x0, inv) if inv > np.float32(0.0) else 0
        codes[page, row, col + 1] = int8_enc(x1, inv) if inv > np.float32(0.0) else 0
    else:
        sh = 6 if fmt == 4 else 4
        sb = group_scale(fmt, amax, g)
        if (col & ((1 << sh) - 1)) == 0:
            scales[page, row, col >> sh] = sb
        codes[page, row, col >> 1] = encode_pair(fmt, x0, x1, group_mult(sb, g), sb)


@cuda.jit
def append_cuda(fmt_id, x, pos0, table, codes, scales, gscale):
    """Same semantics as append_cpu. Block (D/2, 256 // (D/2)); row = token * H + head."""
    T, H, D = x.shape
    P = codes.shape[1]
    smem = cuda.shared.array(_THREADS, np.float32)
    tid = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    col = 2 * cuda.threadIdx.x
    r = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    live = r < T * H
    t, h = (r // H, r % H) if live else (0, 0)
    x0 = x[t, h, col] if live else np.float32(0.0)
    x1 = x[t, h, col + 1] if live else np.float32(0.0)
    amax = max(abs_or_inf(x0), abs_or_inf(x1))
    if fmt_id != 0:
        amax = seg_max(smem, tid, amax, _seg(fmt_id, D // 2))
    if live:
        pos = pos0 + t
        page = table[h, pos // P]
        if page >= 0:  # the host wrapper checks the table; a kernel cannot raise
            _store_pair(fmt_id, x0, x1, amax, gscale[h], codes, scales, page, pos % P, col)


@cuda.jit
def dequant_pages_cuda(fmt_id, codes, scales, pages, gs, out):
    """out[j] = page pages[j] decoded with global gs[j]; out float32 [n, P, D]. Thread per pair."""
    n, P, D = out.shape
    r = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    if r >= n * P:
        return
    col = 2 * cuda.threadIdx.x
    j, t = r // P, r % P
    dequantize_chunk(fmt_id, codes, scales, pages[j], t, col, 2, gs[j], out[j, t], col)


@cuda.jit
def requant_c4g64_cuda(fmt_id, codes, scales, pages, gsrc, out_codes, out_scales, out_g):
    """Block j requantizes page pages[j] (global gsrc[j]) to c4g64 in out_*[j].

    Pass 1 reduces the page amax over the block (-> out_g[j] = global_scale_for(amax));
    pass 2 decodes again (L1/L2 hits), reduces each 64-group's max over its 32 threads, encodes.
    """
    P = codes.shape[1]
    D = out_codes.shape[2] * 2
    smem = cuda.shared.array(_THREADS, np.float32)
    pair = cuda.local.array(2, np.float32)
    tid = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    rows = cuda.blockDim.y
    col = 2 * cuda.threadIdx.x
    j = cuda.blockIdx.x
    page = pages[j]
    g = gsrc[j]
    amax = np.float32(0.0)
    for t in range(cuda.threadIdx.y, P, rows):
        dequantize_chunk(fmt_id, codes, scales, page, t, col, 2, g, pair, 0)
        for k in range(2):
            a = abs(pair[k])
            if a <= F32_MAX and a > amax:  # the page amax ignores non-finite values
                amax = a
    amax = seg_max(smem, tid, amax, _THREADS)
    g2 = global_scale_for(amax)
    if tid == 0:
        out_g[j] = g2
    for t0 in range(0, P, rows):  # uniform trip count: every thread reaches each seg_max
        t = t0 + cuda.threadIdx.y
        x0 = np.float32(0.0)
        x1 = np.float32(0.0)
        if t < P:
            dequantize_chunk(fmt_id, codes, scales, page, t, col, 2, g, pair, 0)
            x0, x1 = pair[0], pair[1]
        m = seg_max(smem, tid, max(abs_or_inf(x0), abs_or_inf(x1)), 32)
        if t < P:
            _store_pair(4, x0, x1, m, g2, out_codes, out_scales, j, t, col)


# Device functions for other kernels (attention): decode one value, or a chunk into a local array.
decode_value_dev = cuda.jit(device=True)(decode_value)
dequantize_chunk_dev = cuda.jit(device=True)(dequantize_chunk)


# ---------------------------------------------------------------------------------- host launches
def _block(head_dim: int) -> tuple[int, int]:
    half = head_dim // 2
    if head_dim < 64 or head_dim > 512 or head_dim & (head_dim - 1):
        raise ValueError(f"CUDA codec kernels need head_dim a power of two in 64..512, got {head_dim}")
    return half, _THREADS // half


def launch_append(fmt_id, x, pos0, table, codes, scales, gscale, stream=0):
    """Quantize-append on the device (device or host arrays). The table must map every position."""
    T, H, D = x.shape
    bx, by = _block(D)
    if T * H:
        append_cuda[math.ceil(T * H / by), (bx, by), stream](fmt_id, x, pos0, table, codes, scales, gscale)


def launch_dequant_pages(fmt_id, codes, scales, pages, gs, out, stream=0):
    n, P, D = out.shape
    bx, by = _block(D)
    if n * P:
        dequant_pages_cuda[math.ceil(n * P / by), (bx, by), stream](fmt_id, codes, scales, pages, gs, out)


def launch_requant_c4g64(fmt_id, codes, scales, pages, gsrc, out_codes, out_scales, out_g, stream=0):
    bx, by = _block(out_codes.shape[2] * 2)
    if pages.shape[0]:
        requant_c4g64_cuda[pages.shape[0], (bx, by), stream](
            fmt_id, codes, scales, pages, gsrc, out_codes, out_scales, out_g)


# ================================================================================== PTX check
_CODE_T = {BF16: "uint16", INT8: "int8", NVFP4: "uint8", ISO3: "uint8", C4G64: "uint8"}
_SCALE_T = {BF16: "uint8", INT8: "float32", NVFP4: "uint8", ISO3: "uint8", C4G64: "uint8"}


def _sigs():
    out = []
    for f in FORMAT_IDS.values():
        c, s = f"{_CODE_T[f]}[:,:,::1]", f"{_SCALE_T[f]}[:,:,::1]"
        out += [
            (append_cuda, f"void(int64, float32[:,:,::1], int64, int32[:,::1], {c}, {s}, float32[::1])"),
            (dequant_pages_cuda, f"void(int64, {c}, {s}, int32[::1], float32[::1], float32[:,:,::1])"),
            (requant_c4g64_cuda, f"void(int64, {c}, {s}, int32[::1], float32[::1], "
                                 "uint8[:,:,::1], uint8[:,:,::1], float32[::1])"),
            (decode_value_dev, f"float32(int64, {c}, {s}, int64, int64, int64, float32)"),
            (dequantize_chunk_dev, f"void(int64, {c}, {s}, int64, int64, int64, int64, float32, "
                                   "float32[::1], int64)"),
        ]
    return out


PTX_SIGNATURES = _sigs()
