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
    f32_bits,
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
# Layout shared by the three kernels (why: the old thread-per-pair kernels were instruction and
# latency bound, not bandwidth bound; docs/formats.md "Kernel speed" has the numbers):
#   - warps, not blocks, own the work: a grid-stride loop hands each warp a unit (a 256-value
#     chunk of x, a page, or a row); no __syncthreads and no block-wide shared reductions.
#   - 4-bit formats: a lane owns 8 consecutive values = one uint32 of codes (8 nibbles), so a
#     16-group is a lane pair and a 64-group 8 lanes: the group max is 1 or 3 shfl_xor, the E4M3
#     scale is computed once per 8 values, and codes move as coalesced 128 B uint32 rows.
#     fp32 x (append) and fp32 out (dequant) go through a warp-private shared-memory row so that
#     global loads/stores stay lane-consecutive (coalesced) while a lane works on 8 consecutive
#     values; the row is padded (slot q + q // 32) so both access orders are bank-conflict free.
#   - bf16 and int8 (no 16/64 groups) are lane-strided: value c of a row goes to lane c % 32.
#   - D (head_dim) is a power of two: row/column come from shifts. Heads and page_tokens use
#     shifts when they are powers of two, else one 32-bit division per unit (not per value).
#   - Same scalar cores as the CPU kernels except the E2M1 encoder (e2m1_enc_bits, bit-identical,
#     cheaper); float math stays float32 and a multiply never feeds an add (fp.py).
_WARPS = 4  # warps per block
_CHUNK = 256  # values per warp step in the 4-bit paths: 8 per lane
_SROW = _CHUNK + _CHUNK // 32  # padded shared-memory row per warp
_FULL = 0xFFFFFFFF
_MAX_BLOCKS = 4096  # grid-stride: ~2 waves of resident warps on an H200 (132 SMs x 64 warps)


@register_jitable
def e2m1_enc_bits(v):
    """float32 -> E2M1 code; the same result as fp.e2m1_enc (RNE, ties to the even code, saturate),
    in 32-bit float ops only (Numba's integer math is 64-bit, twice the instructions on the GPU).

    a = min(|v|, 6) lies in a stretch of the E2M1 grid with a uniform step (0.5 below 2, 1 in
    [2, 4), 2 from 4): adding 2^22, 2^23 or 2^24 (whose ulp is that step) and subtracting it again
    rounds a to the grid, ties to the even multiple of the step = the even code. The code of grid
    value q is min(2q, q + 2, q / 2 + 4) (exact: q has one significant bit after the point) and
    adding 2^23 puts it in the low bits. The min() clamp sits between v = x * r and the first add,
    so no fma contraction can change the rounding (q * 0.5 is exact: fused or not is the same).
    """
    a = min(abs(np.float32(v)), np.float32(6.0))
    big = np.float32(16777216.0) if a >= np.float32(4.0) else (
        np.float32(8388608.0) if a >= np.float32(2.0) else np.float32(4194304.0))
    q = (a + big) - big
    m = min(q + q, min(q + np.float32(2.0), q * np.float32(0.5) + np.float32(4.0)))
    return ((f32_bits(v) >> 28) & 8) | (f32_bits(m + np.float32(8388608.0)) - 0x4B000000)


@register_jitable
def e2m1_dec_bits(c):
    """E2M1 code -> float32, the same value as fp.e2m1_dec, built from bits (no int->float convert):
    magnitude m >= 2 is fp32 with exponent 126 + m // 2 and mantissa bit m & 1; 1 is 0.5; 0 is 0."""
    m = c & 7
    b = ((m + 252) << 22) if m >= 2 else m * 0x3F000000
    return bits_f32(b | ((c & 8) << 28))


@register_jitable
def iso3_dec_bits(c):
    """ISO3 code -> signed magnitude, the same value as fp.iso3_dec: 2^23 + m has m in its low bits."""
    v = bits_f32(0x4B000000 | (c & 7)) - np.float32(8388608.0)
    return bits_f32(f32_bits(v) | ((c & 8) << 28))


@register_jitable
def _log2(n):
    """log2 of a power of two n; -1 when n is not a power of two (the caller divides then)."""
    if n <= 0 or (n & (n - 1)) != 0:
        return -1
    s = 0
    while (1 << s) < n:
        s += 1
    return s


@register_jitable
def _divmod(a, n, sh):
    """(a // n, a % n) for a >= 0, by shift and mask when sh = log2(n) >= 0."""
    if sh >= 0:
        return a >> sh, a & (n - 1)
    q = a // n
    return q, a - q * n


@register_jitable
def _slot(q):
    """Padded shared-memory slot of chunk value q (0..255)."""
    return q + (q >> 5)


@register_jitable
def _absbits(v):
    """|v| as int bits: for floats >= 0 integer order is float order, and NaN/inf sort above every
    finite value, so an integer max carries "this group holds a non-finite value"."""
    return f32_bits(v) & 0x7FFFFFFF


@register_jitable
def _amax_of_bits(m):
    """Group max from _absbits maxima: +inf for a poisoned group (as abs_or_inf), else the float."""
    return np.float32(np.inf) if m > 0x7F7FFFFF else bits_f32(m)


@cuda.jit(device=True)
def _warp_max_bits(m, lanes):
    """Max of m over aligned groups of `lanes` (1, 2, 8 or 32) lanes: log2(lanes) shfl_xor."""
    s = 1
    while s < lanes:
        m = max(m, np.int64(cuda.shfl_xor_sync(_FULL, np.int32(m), s)))
        s *= 2
    return m


@cuda.jit(device=True)
def _encode8(fmt, sm, w, lane, r, sb):
    """uint32 of the 8 codes of this lane's values sm[w, slot(8 lane + j)] (0 for a poisoned group)."""
    word = 0
    if sb != E4M3_NAN:
        for j in range(8):
            v = sm[w, _slot(8 * lane + j)]
            c = iso3_enc(v, r) if fmt == 3 else e2m1_enc_bits(v * r)
            word |= c << (4 * j)
    return word


@cuda.jit(device=True)
def _decode_nibble(fmt, c, d):
    """Value of a 4-bit code with group step d (exactly dequantize_chunk's arithmetic)."""
    return _canon_nan((iso3_dec_bits(c) if fmt == 3 else e2m1_dec_bits(c)) * d)


@cuda.jit(device=True)
def _canon_nan(v):
    """The CPU's NaN bits for a poisoned group: GPU arithmetic on a NaN gives 0x7FFFFFFF instead."""
    return bits_f32(0x7FC00000) if v != v else v


@cuda.jit
def append_cuda(fmt_id, x, pos0, table, codes, scales, gscale):
    """Same semantics as append_cpu; x [T, H, D] fp32, row (t, h) goes to table[h, (pos0+t) // P]."""
    T, H, D = x.shape
    P = codes.shape[1]
    sm = cuda.shared.array((_WARPS, _SROW), np.float32)
    lane = cuda.threadIdx.x & 31
    w = cuda.threadIdx.x >> 5
    gw = cuda.blockIdx.x * _WARPS + w
    nw = cuda.gridDim.x * _WARPS
    ld, lh, lp = _log2(D), _log2(H), _log2(P)
    if fmt_id <= 1:  # bf16, int8: a warp per row, lane-strided
        for rr in range(gw, T * H, nw):
            t, h = _divmod(rr, H, lh)
            pi, pr = _divmod(pos0 + t, P, lp)
            page = table[h, pi]
            if page < 0:  # the host wrapper checks the table; a kernel cannot raise
                continue
            if fmt_id == 0:
                for c in range(lane, D, 32):
                    codes[page, pr, c] = bf16_enc(x[t, h, c])
                continue
            m = 0
            for c in range(lane, D, 32):
                m = max(m, _absbits(x[t, h, c]))
            scale, inv = int8_row_scale(_amax_of_bits(_warp_max_bits(m, 32)))
            if lane == 0:
                scales[page, pr, 0] = scale
            for c in range(lane, D, 32):  # x again: L1 hits
                codes[page, pr, c] = int8_enc(x[t, h, c], inv) if inv > np.float32(0.0) else 0
        return
    # 4-bit: chunk = 256 consecutive values of x (flat [T*H*D]); rows are D >= 64 values, so a
    # chunk holds whole 16/64-groups. codes viewed as uint32 [n_pages, P, D/8].
    codes32 = codes.view(np.uint32)
    gsh = 6 if fmt_id == 4 else 4
    n = T * H * D
    for base in range(gw * _CHUNK, n, nw * _CHUNK):
        # coalesced load: slot k holds values base + 32k + lane, one row (t, h) per slot
        t, h = _divmod(base >> ld, H, lh)
        for k in range(_CHUNK // 32):
            q = base + 32 * k + lane
            if k > 0 and ((32 * k) & (D - 1)) == 0:  # next row
                h += 1
                if h == H:
                    h = 0
                    t += 1
            sm[w, _slot(32 * k + lane)] = x[t, h, q & (D - 1)] if q < n else np.float32(0.0)
        cuda.syncwarp()
        # lane owns values q0 .. q0 + 7
        q0 = base + 8 * lane
        m = 0
        for j in range(8):
            m = max(m, _absbits(sm[w, _slot(8 * lane + j)]))
        amax = _amax_of_bits(_warp_max_bits(m, 8 if fmt_id == 4 else 2))
        if q0 < n:
            t, h = _divmod(q0 >> ld, H, lh)
            pi, pr = _divmod(pos0 + t, P, lp)
            page = table[h, pi]
            if page >= 0:
                g = gscale[h]
                sb = group_scale(fmt_id, amax, g)
                col = q0 & (D - 1)
                codes32[page, pr, col >> 3] = _encode8(fmt_id, sm, w, lane, group_mult(sb, g), sb)
                if (col & ((1 << gsh) - 1)) == 0:
                    scales[page, pr, col >> gsh] = sb
        cuda.syncwarp()  # the row is refilled by the next chunk


@cuda.jit
def dequant_pages_cuda(fmt_id, codes, scales, pages, gs, out):
    """out[j] = page pages[j] decoded with global gs[j]; out float32 [n, P, D]. A warp per page."""
    n, P, D = out.shape
    sm = cuda.shared.array((_WARPS, _SROW), np.float32)
    lane = cuda.threadIdx.x & 31
    w = cuda.threadIdx.x >> 5
    ld = _log2(D)
    pd = P * D
    gsh = 6 if fmt_id == 4 else 4
    codes32 = codes.view(np.uint32)  # the 4-bit path reads 8 codes per lane as one uint32
    for j in range(cuda.blockIdx.x * _WARPS + w, n, cuda.gridDim.x * _WARPS):
        page = pages[j]
        g = gs[j]
        if fmt_id <= 1:  # lane-strided, coalesced both ways
            for q in range(lane, pd, 32):
                t, c = q >> ld, q & (D - 1)
                if fmt_id == 0:
                    out[j, t, c] = bf16_dec(codes[page, t, c])
                else:
                    out[j, t, c] = _canon_nan(np.float32(codes[page, t, c]) * np.float32(scales[page, t, 0]))
            continue
        for base in range(0, pd, _CHUNK):
            q0 = base + 8 * lane
            if q0 < pd:  # decode this lane's 8 values (one uint32, one group step) into its slots
                t, c = q0 >> ld, q0 & (D - 1)
                word = np.int64(codes32[page, t, c >> 3])
                d = e4m3_dec(np.int64(scales[page, t, c >> gsh])) / np.float32(g)
                for k in range(8):
                    sm[w, _slot(8 * lane + k)] = _decode_nibble(fmt_id, (word >> (4 * k)) & 15, d)
            cuda.syncwarp()
            for k in range(_CHUNK // 32):  # coalesced stores
                q = base + 32 * k + lane
                if q < pd:
                    out[j, q >> ld, q & (D - 1)] = sm[w, _slot(32 * k + lane)]
            cuda.syncwarp()


@cuda.jit(device=True)
def _decode8(fmt, codes, scales, page, t, c, g, vals):
    """vals[0:8] = decoded values c .. c+7 of row t of `page` (c a multiple of 8)."""
    if fmt == 0:
        w2 = codes.view(np.uint64)  # 4 bf16 per uint64
        for h in range(2):
            word = np.int64(w2[page, t, (c >> 2) + h])  # int64 view of the bits: shifts below mask
            for k in range(4):
                vals[4 * h + k] = bf16_dec((word >> (16 * k)) & 0xFFFF)
    elif fmt == 1:
        word = np.int64(codes.view(np.uint64)[page, t, c >> 3])  # 8 int8 codes
        s = np.float32(scales[page, t, 0])
        for k in range(8):
            b = (word >> (8 * k)) & 0xFF
            vals[k] = np.float32(b - 256 if b >= 128 else b) * s
    else:
        word = np.int64(codes.view(np.uint32)[page, t, c >> 3])
        d = e4m3_dec(np.int64(scales[page, t, c >> (6 if fmt == 4 else 4)])) / np.float32(g)
        for k in range(8):
            vals[k] = _decode_nibble(fmt, (word >> (4 * k)) & 15, d)


@cuda.jit(device=True)
def _src4(fmt, codes, scales, page, t, c, g):
    """4-bit source, the lane's 8 values c .. c+7 of row t: (code word, group step d, lm) with
    lm = |dec(max code magnitude) * d| = max |value| (rounding is monotonic; may be inf or NaN)."""
    word = np.int64(codes.view(np.uint32)[page, t, c >> 3])
    mm = 0
    for k in range(8):
        mm = max(mm, (word >> (4 * k)) & 7)
    d = e4m3_dec(np.int64(scales[page, t, c >> (6 if fmt == 4 else 4)])) / np.float32(g)
    return word, d, abs(_decode_nibble(fmt, mm, d))


@cuda.jit(device=True)
def _warp_or(v, lanes):
    """OR of v (< 2^31) over aligned groups of `lanes` lanes."""
    s = 1
    while s < lanes:
        v |= np.int64(cuda.shfl_xor_sync(_FULL, np.int32(v), s))
        s *= 2
    return v


@cuda.jit
def requant_c4g64_cuda(fmt_id, codes, scales, pages, gsrc, out_codes, out_scales, out_g):
    """Requantize page pages[j] (global gsrc[j]) to c4g64 in out_*[j]; a warp per page.

    Lane owns 8 consecutive values (one output uint32, 1/8 of a 64-group). Pass 1: the page's
    finite amax -> out_g[j]; for 4-bit sources a lane's max is _src4's lm, falling back to all 8
    values only when that is not finite. Pass 2 reads the page again (L1/L2 hits), takes the
    64-group max with 3 shfl_xor and encodes. A 4-bit source group shares its step d and its output
    group the multiplier r, so its output code is a function of the source code: the 2 (nvfp4,
    iso3) or 8 (c4g64) lanes of a source group build the table m -> E2M1 magnitude of dec(m) * d * r
    (8 nibbles) together, then each lane looks its 8 codes up: 4 or 1 encodes per lane, not 8.
    The sign of a code is sign(source code) ^ sign(d) ^ sign(r), as IEEE products have it.
    """
    P = codes.shape[1]
    D = out_codes.shape[2] * 2
    lane = cuda.threadIdx.x & 31
    vals = cuda.local.array(8, np.float32)
    ld = _log2(D)
    pd = P * D
    out32 = out_codes.view(np.uint32)
    for j in range(cuda.blockIdx.x * _WARPS + (cuda.threadIdx.x >> 5), pages.shape[0],
                   cuda.gridDim.x * _WARPS):
        page = pages[j]
        g = gsrc[j]
        amax = np.float32(0.0)
        for q0 in range(8 * lane, pd, _CHUNK):
            t, c = q0 >> ld, q0 & (D - 1)
            lm = np.float32(np.inf)
            if fmt_id >= 2:
                _, _, lm = _src4(fmt_id, codes, scales, page, t, c, g)
            if lm <= F32_MAX:
                amax = max(amax, lm)
            else:  # bf16/int8 source, or a product that overflowed / a poisoned group
                _decode8(fmt_id, codes, scales, page, t, c, g, vals)
                for k in range(8):
                    a = abs(vals[k])
                    if a <= F32_MAX and a > amax:  # the page amax ignores non-finite values
                        amax = a
        for s in (16, 8, 4, 2, 1):
            amax = max(amax, cuda.shfl_xor_sync(_FULL, amax, s))
        g2 = global_scale_for(amax)
        if lane == 0:
            out_g[j] = g2
        for base in range(0, pd, _CHUNK):  # warp-uniform trip count: every lane shuffles
            q0 = base + 8 * lane
            live = q0 < pd  # P * D is a multiple of 64: a 64-group is all live or all not
            t, c = q0 >> ld, q0 & (D - 1)
            out = 0
            if fmt_id >= 2:
                word, d, lm = 0, np.float32(0.0), np.float32(0.0)
                if live:
                    word, d, lm = _src4(fmt_id, codes, scales, page, t, c, g)
                gm = abs_or_inf(lm)
                for s in (1, 2, 4):
                    gm = max(gm, cuda.shfl_xor_sync(_FULL, gm, s))
                sb = group_scale(4, gm, g2)
                r = group_mult(sb, g2)
                lut = 0
                if fmt_id == 4:
                    m = lane & 7
                    lut = _warp_or((e2m1_enc_bits(_decode_nibble(fmt_id, m, d) * r) & 7) << (4 * m), 8)
                else:
                    for i in range(4):
                        m = 2 * i + (lane & 1)
                        lut |= (e2m1_enc_bits(_decode_nibble(fmt_id, m, d) * r) & 7) << (4 * m)
                    lut = _warp_or(lut, 2)
                if live and sb != E4M3_NAN:
                    for k in range(8):
                        out |= ((lut >> (4 * ((word >> (4 * k)) & 7))) & 7) << (4 * k)
                    neg = ((f32_bits(d) ^ f32_bits(r)) >> 31) & 1
                    out ^= (word & 0x88888888) ^ (0x88888888 if neg else 0)
            else:
                m = 0
                if live:
                    _decode8(fmt_id, codes, scales, page, t, c, g, vals)
                    for k in range(8):
                        m = max(m, _absbits(vals[k]))
                sb = group_scale(4, _amax_of_bits(_warp_max_bits(m, 8)), g2)
                r = group_mult(sb, g2)
                if live and sb != E4M3_NAN:
                    for k in range(8):
                        out |= e2m1_enc_bits(vals[k] * r) << (4 * k)
            if live:
                out32[j, t, c >> 3] = out
                if (c & 63) == 0:
                    out_scales[j, t, c >> 6] = sb


# Device functions for other kernels (attention): decode one value, or a chunk into a local array.
decode_value_dev = cuda.jit(device=True)(decode_value)
dequantize_chunk_dev = cuda.jit(device=True)(dequantize_chunk)


# ---------------------------------------------------------------------------------- host launches
def _check_head_dim(head_dim: int) -> None:
    if head_dim < 64 or head_dim > 512 or head_dim & (head_dim - 1):
        raise ValueError(f"CUDA codec kernels need head_dim a power of two in 64..512, got {head_dim}")


def _grid(units: int) -> int:
    """Blocks for `units` warp work units (grid-stride loops take any excess)."""
    return min(_MAX_BLOCKS, math.ceil(units / _WARPS))


def launch_append(fmt_id, x, pos0, table, codes, scales, gscale, stream=0):
    """Quantize-append on the device (device or host arrays). The table must map every position."""
    T, H, D = x.shape
    _check_head_dim(D)
    units = T * H if fmt_id <= 1 else math.ceil(T * H * D / _CHUNK)
    if units:
        append_cuda[_grid(units), 32 * _WARPS, stream](fmt_id, x, pos0, table, codes, scales, gscale)


def launch_dequant_pages(fmt_id, codes, scales, pages, gs, out, stream=0):
    n, P, D = out.shape
    _check_head_dim(D)
    if n * P:
        dequant_pages_cuda[_grid(n), 32 * _WARPS, stream](fmt_id, codes, scales, pages, gs, out)


def launch_requant_c4g64(fmt_id, codes, scales, pages, gsrc, out_codes, out_scales, out_g, stream=0):
    _check_head_dim(out_codes.shape[2] * 2)
    if pages.shape[0] and codes.shape[1]:
        requant_c4g64_cuda[_grid(pages.shape[0]), 32 * _WARPS, stream](
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
