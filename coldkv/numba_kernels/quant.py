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
from numba import config, cuda
from numba.extending import register_jitable

from coldkv.numba_kernels.jit_cache import cached_njit, cuda_kernel
from coldkv.numba_kernels.ptx import prmt
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
    "append_cuda", "dequant_pages_cuda", "launch_append", "launch_dequant_pages", "PTX_SIGNATURES",
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
@cached_njit()
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


@cached_njit()
def dequant_rows_cpu(fmt_id, codes, scales, page, t0, t1, gscale_h, out):
    """Decode rows t0..t1-1 of one page into out float32 [t1 - t0, D]: dequantize_chunk's values,
    bit for bit (the same float32 products), in loops over the page's 2-D views. A 4-bit group's
    16 possible values are made once and its codes looked up: the branchy per-value decode cost
    the CPU attention ~3 ns a value."""
    D = out.shape[1]
    pc = codes[page]  # [P, code columns]
    ps = scales[page]  # [P, scale columns]
    if fmt_id == 0:
        for t in range(t0, t1):
            for d in range(D):
                out[t - t0, d] = bf16_dec(pc[t, d])
        return
    if fmt_id == 1:
        for t in range(t0, t1):
            s = np.float32(ps[t, 0])
            for d in range(D):
                out[t - t0, d] = np.float32(pc[t, d]) * s
        return
    gs = np.float32(gscale_h)
    group = 64 if fmt_id == 4 else 16
    base = np.empty(16, np.float32)  # the codes' values before the step
    for c in range(16):
        base[c] = iso3_dec(c) if fmt_id == 3 else e2m1_dec(c)
    lut = np.empty(16, np.float32)  # the group's 16 values
    for t in range(t0, t1):
        row = out[t - t0]
        for gi in range(D // group):
            d = e4m3_dec(np.int64(ps[t, gi])) / gs
            for c in range(16):
                lut[c] = base[c] * d
            for b in range(gi * group // 2, (gi + 1) * group // 2):
                byte = pc[t, b]
                row[2 * b] = lut[byte & 15]
                row[2 * b + 1] = lut[byte >> 4]


@cached_njit()
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
# Layout of the three kernels (why: docs/kernels_log.md "Codec kernels at 036ad84" has the measurements):
#   - One compiled kernel per format (factories below close over the format id), so each
#     format's kernel carries only its own code: fewer registers, more resident warps.
#   - warps, not blocks, own the work: grid-stride loops hand each warp 32 units (append) or a
#     page (dequant, requant); no __syncthreads, no shared memory. A scale group spread over
#     several lanes takes its max with shfl_xor; dequant hands group steps around with shfl.
#   - Memory moves in 16-byte vectors (_ld4/_st4: ld/st.global.v4): a memory-bound kernel needs
#     many bytes in flight per thread, and one 4-byte access per thread leaves the H200's copy
#     bandwidth at ~60% (bench/codecs.py measures both). Page kernels address pages flat
#     (_ldf/_stf4: base + offset, one 64-bit add) instead of 3-D index math per access.
#   - append: a lane owns 16 consecutive values of a row (4 vector loads): one 16-group, a
#     quarter of a 64-group (2 shuffles), 1/4..1/32 of an int8 row; it writes their codes as one
#     8 B (4-bit), 16 B (int8) or 2 x 16 B (bf16) store. The E4M3 scale costs once per 16 values.
#   - dequant: a lane owns 4 consecutive values per step, so the fp32 stores (7/8 of the bytes)
#     are fully coalesced 16 B vectors; an iteration is 8 steps (1024 values per warp) whose code
#     words are all loaded one iteration ahead, and a group's step s / g is divided once per
#     group (by one lane) instead of once per 4 values.
#   - D (head_dim) is a power of two: row/column come from shifts. Heads and page_tokens use
#     shifts when they are powers of two, else one division per unit (not per value).
#   - Same scalar cores as the CPU kernels except the E2M1 encoder and decoders (*_bits below,
#     bit-identical, cheaper); float math stays float32 and a multiply never feeds an add (fp.py).
_WARPS = 4  # warps per block
_FULL = 0xFFFFFFFF
_MAX_BLOCKS = 4096  # grid cap before a kernel's occupancy is known (its first launch compiles it)

# 16-byte (or 8-byte) vector loads and stores of 32-bit elements a[idx], a[idx + 1], ... along the
# last axis (numba emits one scalar access per element otherwise). The launchers check that the
# last axis is contiguous and rows are 16-byte aligned. Under the simulator, plain indexing.
if config.ENABLE_CUDASIM:
    def _ldv(a, idx, n):
        *lead, c = idx
        return tuple(a[(*lead, c + m)] for m in range(n))

    def _ld4(a, idx):
        return _ldv(a, idx, 4)

    def _stv(a, idx, vals):
        *lead, c = idx
        for m, v in enumerate(vals):
            a[(*lead, c + m)] = v

    _st4 = _st2 = _stv
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    def _vec_ptr(context, builder, aryty, ary, idxty, idx, n):
        arr = context.make_array(aryty)(context, builder, value=ary)
        inds = [context.cast(builder, v, t, types.intp)
                for v, t in zip(cgutils.unpack_tuple(builder, idx, len(idxty)), idxty)]
        ptr = cgutils.get_item_pointer(context, builder, aryty, arr, inds, wraparound=False)
        return builder.bitcast(ptr, ir.VectorType(context.get_value_type(aryty.dtype), n).as_pointer())

    def _make_ld(n):
        @intrinsic
        def ld(typingctx, a, idx):
            def codegen(context, builder, sig, args):
                vp = _vec_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], n)
                v = builder.load(vp, align=4 * n)
                vals = [builder.extract_element(v, ir.Constant(ir.IntType(32), m)) for m in range(n)]
                return context.make_tuple(builder, sig.return_type, vals)
            return types.UniTuple(a.dtype, n)(a, idx), codegen
        return ld

    def _make_st(n):
        @intrinsic
        def st(typingctx, a, idx, vals):
            def codegen(context, builder, sig, args):
                aty, ity, vty = sig.args
                vp = _vec_ptr(context, builder, aty, args[0], ity, args[1], n)
                vec = ir.Constant(ir.VectorType(context.get_value_type(aty.dtype), n), ir.Undefined)
                for m, (v, t) in enumerate(zip(cgutils.unpack_tuple(builder, args[2], n), vty)):
                    vec = builder.insert_element(vec, context.cast(builder, v, t, aty.dtype),
                                                 ir.Constant(ir.IntType(32), m))
                builder.store(vec, vp, align=4 * n)
            return types.void(a, idx, vals), codegen
        return st

    _ld4 = _make_ld(4)
    _st4, _st2 = _make_st(4), _make_st(2)


# Flat access: element `off` of a C-contiguous array seen as 1-D (pointer + offset; no per-axis
# index math or wraparound). The kernels compute page offsets once per page.
if config.ENABLE_CUDASIM:
    def _ldf(a, off):
        return a.reshape(-1)[off]

    def _ldf4(a, off):
        f = a.reshape(-1)
        return (f[off], f[off + 1], f[off + 2], f[off + 3])

    def _stf4(a, off, vals):
        f = a.reshape(-1)
        for m, v in enumerate(vals):
            f[off + m] = v

    def _stf(a, off, val):
        a.reshape(-1)[off] = val

    def _ldw(a, off):
        f = a.reshape(-1)
        return np.uint32(int(f[off]) | (int(f[off + 1]) << 8) | (int(f[off + 2]) << 16) | (int(f[off + 3]) << 24))
else:
    def _flat_ptr(context, builder, aryty, ary, offty, off):
        arr = context.make_array(aryty)(context, builder, value=ary)
        return builder.gep(arr.data, [context.cast(builder, off, offty, types.intp)])

    @intrinsic
    def _ldf(typingctx, a, off):
        def codegen(context, builder, sig, args):
            return builder.load(_flat_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1]))
        return a.dtype(a, off), codegen

    @intrinsic
    def _ldf4(typingctx, a, off):
        def codegen(context, builder, sig, args):
            aty, oty = sig.args
            et = context.get_value_type(aty.dtype)
            vp = builder.bitcast(_flat_ptr(context, builder, aty, args[0], oty, args[1]),
                                 ir.VectorType(et, 4).as_pointer())
            v = builder.load(vp, align=4 * aty.dtype.bitwidth // 8)
            vals = [builder.extract_element(v, ir.Constant(ir.IntType(32), m)) for m in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)
        return types.UniTuple(a.dtype, 4)(a, off), codegen

    @intrinsic
    def _stf4(typingctx, a, off, vals):
        def codegen(context, builder, sig, args):
            aty, oty, vty = sig.args
            et = context.get_value_type(aty.dtype)
            vp = builder.bitcast(_flat_ptr(context, builder, aty, args[0], oty, args[1]),
                                 ir.VectorType(et, 4).as_pointer())
            vec = ir.Constant(ir.VectorType(et, 4), ir.Undefined)
            for m, (v, t) in enumerate(zip(cgutils.unpack_tuple(builder, args[2], 4), vty)):
                vec = builder.insert_element(vec, context.cast(builder, v, t, aty.dtype),
                                             ir.Constant(ir.IntType(32), m))
            builder.store(vec, vp, align=4 * aty.dtype.bitwidth // 8)
        return types.void(a, off, vals), codegen

    @intrinsic
    def _stf(typingctx, a, off, val):
        def codegen(context, builder, sig, args):
            aty, oty, vty = sig.args
            builder.store(context.cast(builder, args[2], vty, aty.dtype),
                          _flat_ptr(context, builder, aty, args[0], oty, args[1]))
        return types.void(a, off, val), codegen

    @intrinsic
    def _ldw(typingctx, a, off):
        """uint32 of the 4 bytes at flat offset off (a multiple of 4) of a 1-byte array."""
        def codegen(context, builder, sig, args):
            p = builder.bitcast(_flat_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1]),
                                ir.IntType(32).as_pointer())
            return builder.load(p, align=4)
        return types.uint32(a, off), codegen


@register_jitable
def _u32(x):
    """Low 32 bits as uint32: the decoders below then compile to 32-bit integer ops (Numba types
    integer arithmetic as 64-bit; LLVM narrows it when the operands come from a uint32)."""
    return np.uint32(np.int64(x) & 0xFFFFFFFF)


@register_jitable
def e2m1_enc_bits(v):
    """float32 -> E2M1 code; the same result as fp.e2m1_enc (RNE, ties to the even code, saturate).

    |v| >= 1 (E2M1 normals): E2M1 keeps 1 of fp32's 23 mantissa bits, so round the fp32 bits at
    bit 22 (RNE: add 0x1FFFFF plus the lowest kept bit; a carry rolls into the exponent); then
    (bits >> 22) = 2 * exponent + mantissa bit, and code = that - 2 * 126, saturated at 7.
    |v| < 1 (step 0.5): RNE(2 |v|) by adding 2^23 (whose ulp is 1) gives code 0, 1 or 2.
    2 |v| is exact, so an fma contraction of the add cannot change the rounding. NaN gives 7.
    Both are computed and one is selected (no divergent branch), every integer step cast back to
    uint32 so it compiles to 32-bit ops (numba types integer arithmetic as 64-bit).
    """
    b = _u32(f32_bits(v))
    a = b & np.uint32(0x7FFFFFFF)
    r = np.uint32(a + np.uint32(0x1FFFFF) + ((a >> np.uint32(22)) & np.uint32(1)))  # < 2^32: a < 2^31
    mh = min(np.uint32(r >> np.uint32(22)), np.uint32(259))  # 254..259 (code + 252) when a >= 1
    ml = np.uint32(_u32(f32_bits(bits_f32(a) * np.float32(2.0) + np.float32(8388608.0)))
                   - np.uint32(0x4B000000 - 252))  # 252..254 when a < 1 (the sum is >= 2^23)
    m = np.uint32((mh if a >= np.uint32(0x3F800000) else ml) - np.uint32(252))
    return np.int64(((b >> np.uint32(28)) & np.uint32(8)) | m)


@register_jitable
def e2m1_dec_bits(c):
    """E2M1 code -> float32, the same value as fp.e2m1_dec, built from bits (no int->float convert):
    magnitude m >= 2 is fp32 with exponent 126 + m // 2 and mantissa bit m & 1; 1 is 0.5; 0 is 0."""
    c = _u32(c)
    m = c & np.uint32(7)
    b = ((m + np.uint32(252)) << np.uint32(22)) if m >= np.uint32(2) else m * np.uint32(0x3F000000)
    return bits_f32(b | ((c & np.uint32(8)) << np.uint32(28)))


@register_jitable
def iso3_dec_bits(c):
    """ISO3 code -> signed magnitude, the same value as fp.iso3_dec: 2^23 + m has m in its low bits."""
    c = _u32(c)
    v = bits_f32(np.uint32(0x4B000000) | (c & np.uint32(7))) - np.float32(8388608.0)
    return bits_f32(_u32(f32_bits(v)) | ((c & np.uint32(8)) << np.uint32(28)))


@register_jitable
def _int8_code_f32(b):
    """int8 code (its byte b, 0..255) as float32 without an int->float convert (numba's is 64-bit,
    a slow multi-instruction conversion on the GPU): 2^23 + 128 + code has the biased code in its
    low bits, and the subtraction is exact."""
    return bits_f32(np.uint32(0x4B000000) | ((_u32(b) & np.uint32(0xFF)) ^ np.uint32(0x80))) - np.float32(8388736.0)


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


@register_jitable
def _enc4(fmt, v, r):
    """4-bit code of value v with multiplier r (nvfp4/c4g64 E2M1, iso3 sign + magnitude)."""
    return iso3_enc(v, r) if fmt == 3 else e2m1_enc_bits(v * r)


@cuda.jit(device=True)
def _decode_nibble(fmt, c, d):
    """Value of a 4-bit code with group step d (exactly dequantize_chunk's arithmetic)."""
    return _canon_nan((iso3_dec_bits(c) if fmt == 3 else e2m1_dec_bits(c)) * d)


@cuda.jit(device=True)
def _canon_nan(v):
    """The CPU's NaN bits for a poisoned group: GPU arithmetic on a NaN gives 0x7FFFFFFF instead."""
    return bits_f32(0x7FC00000) if v != v else v


@register_jitable
def _int8_word(v, k, inv):
    """uint32 of the int8 codes of v[k .. k+3]."""
    w = 0
    for j in range(4):
        w |= (int8_enc(v[k + j], inv) & 0xFF) << (8 * j)
    return w


# PRMT (byte permute): result byte i = byte (sel >> 4 i) & 7 of the 8 bytes hi:lo. The requant
# kernel looks 4 codes up in an 8-entry byte table with one instruction.
if config.ENABLE_CUDASIM:
    def _prmt(lo, hi, sel):
        both = (int(hi) << 32) | int(lo)
        return sum(((both >> (8 * ((int(sel) >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
else:
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def _prmt(lo, hi, sel):
        return np.int64(libdevice.byte_perm(np.int32(lo), np.int32(hi), np.int32(sel))) & 0xFFFFFFFF


# E2M1 magnitude of |y| by six saturating float ops, no integer work (the ALU pipe, half the rate
# of the FMA pipe on sm_90, bounded the integer encoder e2m1_enc_bits; ncu at 8b53cfa):
#   mag = rint(2 min(|y|, 2)) + rint(clamp(|y| - 2, 0, 2)) + rint(clamp(|y|/2 - 2, 0, 1))
# The three clamps are .sat (clamp to [0, 1]) of |y|/2, |y|/2 - 1 and |y|/2 - 2, all exact; the
# roundings are the RNE of adding 2^23, chained: a later term is nonzero only when the earlier
# sum is even (4, then 6), so the chained sum breaks ties exactly as each term would, i.e. ties to
# the even E2M1 code. Returns the float bits 0x4B000000 + mag. NaN gives 0 (.sat flushes NaN);
# callers never encode NaN on this path (such groups are poisoned, or take e2m1_enc_bits).
# e2m1_mag_bits_x(x, c) is the magnitude of y = 2 c x for a power of two c (the exact scaling
# folds into the clamps' multiplier).
if config.ENABLE_CUDASIM:
    def _sat(v):
        return min(max(v, 0.0), 1.0) if v == v else 0.0

    def e2m1_mag_bits_x(y, c):
        a = abs(float(np.float32(y))) * float(c)  # c a power of two: exact
        u = np.float32(_sat(float(np.float32(a))))
        v = np.float32(_sat(float(np.float32(a - 1.0))))  # fma: one rounding
        w = np.float32(_sat(float(np.float32(a - 2.0))))
        t = np.float32(float(u) * 4.0 + 8388608.0)
        t = np.float32(float(v) * 2.0 + float(t))
        t = np.float32(float(w) + float(t))
        return np.uint32(t.view(np.uint32))

    def e2m1_mag_bits(y):
        return e2m1_mag_bits_x(y, 0.5)

    def _lanes(x, signed):
        lo, hi = int(x) & 0xFFFF, (int(x) >> 16) & 0xFFFF
        if signed:
            lo, hi = lo - ((lo & 0x8000) << 1), hi - ((hi & 0x8000) << 1)
        return lo, hi

    def _simd16(op, signed):
        def f(a, b):
            (a0, a1), (b0, b1) = _lanes(a, signed), _lanes(b, signed)
            return np.uint32((op(a0, b0) & 0xFFFF) | ((op(a1, b1) & 0xFFFF) << 16))
        return f

    max_u16x2, max_s16x2, min_s16x2 = _simd16(max, False), _simd16(max, True), _simd16(min, True)

    def e4m3_sat_bits(v):
        return np.uint32(e4m3_enc(min(np.float32(v), E4M3_MAX)) * 0x101)

    def _ro16(x):
        """float32 x >= 0 rounded to fp16 toward zero, lowest bit set when inexact (round to odd)."""
        h = np.float16(x)
        if float(h) > x:
            h = np.nextafter(h, np.float16(0))
        if float(h) != x:
            h = np.uint16(h.view(np.uint16) | 1).view(np.float16)
        return float(h)

    def _mag16(x, c):
        """The fp16 six-op encoder (one rounding to fp16 per instruction; .sat maps NaN to 0)."""
        def f16(v):
            return float(np.float16(v))
        p = x * c if c else 0.0  # x may be inf; c = 0 gives 0 (NaN, then .sat)
        u, v, w = _sat(f16(p)), _sat(f16(p - 1.0)), _sat(f16(p - 2.0))
        t = f16(u * 4.0 + 1024.0)
        t = f16(v * 2.0 + t)
        return int(f16(w + t)) - 1024

    def e2m1_table16(a, b):
        ha, hb = _ro16(abs(float(np.float32(a)))), _ro16(abs(float(np.float32(b))))
        lo = (_mag16(ha, 0.25) << 8) | (_mag16(ha, 0.5) << 16) | (_mag16(hb, 0.5) << 24)
        hi = _mag16(ha, 1.0) | (_mag16(hb, 1.0) << 8) | (_mag16(ha, 2.0) << 16) | (_mag16(hb, 2.0) << 24)
        return np.uint32(lo), np.uint32(hi)

    def e4m3_f32(b):
        return np.float32(e4m3_dec(int(b) & 0xFF))

    def rcp_approx(x):
        x = float(np.float32(x))
        return np.float32(np.inf if x == 0.0 else 1.0 / x)

    e2m1_table16q = e2m1_table16

    def iso3_table16q(p1, p3, p5, p7):
        h1, h3, h5, h7 = (_ro16(abs(float(np.float32(v)))) for v in (p1, p3, p5, p7))
        lo = (_mag16(h1, 0.5) << 8) | (_mag16(h1, 1.0) << 16) | (_mag16(h3, 0.5) << 24)
        hi = _mag16(h1, 2.0) | (_mag16(h5, 0.5) << 8) | (_mag16(h3, 1.0) << 16) | (_mag16(h7, 0.5) << 24)
        return np.uint32(lo), np.uint32(hi)

    def e4m3_sat_byte(v):
        return np.uint32(e4m3_sat_bits(v) & 0xFF)

    def fdiv6(x):
        return np.float32(np.float32(x) / np.float32(6.0))

    def fdivp(a, b):
        return np.float32(np.float32(a) / np.float32(b)) if b != 0 else np.float32(np.inf)

    def and3(a, b, c):
        return np.uint32(int(a) & int(b) & int(c))

    def mul_sat(a, b):
        return np.float32(_sat(float(np.float32(np.float32(a) * np.float32(b)))))

    def fma_sat(a, b, c):
        # exact in float64 for the callers' operands (y 2^30 and a 3-bit constant): one rounding
        return np.float32(_sat(float(np.float32(float(np.float32(a)) * float(b) + float(c)))))

    def fma_rp(a, b, c):
        from fractions import Fraction
        x = Fraction(float(np.float32(a))) * Fraction(float(b)) + Fraction(float(c))  # exact
        v = np.float32(float(x))
        return v if Fraction(float(v)) >= x else np.nextafter(v, np.float32(np.inf))

else:
    from numba import types as _t

    from coldkv.numba_kernels.ptx import asm

    _MAG = ("{{.reg .f32 a, u, v, w, t;\n abs.f32 a, $1;\n mul.rn.sat.f32 u, a, {0};\n"
            " fma.rn.sat.f32 v, a, {0}, 0fBF800000;\n fma.rn.sat.f32 w, a, {0}, 0fC0000000;\n"
            " fma.rn.f32 t, u, 0f40800000, 0f4B000000;\n fma.rn.f32 t, v, 0f40000000, t;\n"
            " add.rn.f32 t, w, t;\n mov.b32 $0, t;}}")
    e2m1_mag_bits = asm(_MAG.format("0f3F000000"), "=r,f", _t.uint32, (_t.float32,))
    e2m1_mag_bits_x = asm(_MAG.format("$2"), "=r,f,f", _t.uint32, (_t.float32, _t.float32))
    max_u16x2 = asm("max.u16x2 $0, $1, $2;", "=r,r,r", _t.uint32, (_t.uint32, _t.uint32))
    max_s16x2 = asm("max.s16x2 $0, $1, $2;", "=r,r,r", _t.uint32, (_t.uint32, _t.uint32))
    min_s16x2 = asm("min.s16x2 $0, $1, $2;", "=r,r,r", _t.uint32, (_t.uint32, _t.uint32))
    # Building blocks: _RO16 rounds two float32 >= 0 ({0}, {1}) to an fp16 pair ({2}: {0} low) by
    # round-to-odd in integer ops (for x >= 0 in fp16's normal range rz(x | sticky at bit 13) is
    # round-to-odd: x + 0x1FFF carries into bit 13 exactly when a dropped bit is set; below 2^-14 every
    # table entry is 0 either way (the largest product looked up is 4x < 1/4), above 65504 rz saturates
    # to 65504 either way); _ENC16 is the six-op encoder on an f16x2 pair ({0}) with multipliers {1}, into {2}.
    _RO16 = (" mov.b32 ta, {0};\n add.u32 tb, ta, 0x1FFF;\n and.b32 tb, tb, 0x2000;\n or.b32 ta, ta, tb;\n"
             " mov.b32 xa, ta;\n mov.b32 tc, {1};\n add.u32 td, tc, 0x1FFF;\n and.b32 td, td, 0x2000;\n"
             " or.b32 tc, tc, td;\n mov.b32 xb, tc;\n cvt.rz.f16x2.f32 {2}, xb, xa;\n")
    _ENC16 = (" mov.b32 k, {1};\n mul.rn.sat.f16x2 u, {0}, k;\n fma.rn.sat.f16x2 v, {0}, k, m1;\n"
              " fma.rn.sat.f16x2 w, {0}, k, m2;\n fma.rn.f16x2 t, u, f4, big;\n fma.rn.f16x2 t, v, f2, t;\n"
              " add.rn.f16x2 {2}, w, t;\n")
    _ENC16_CONSTS = (" mov.b32 m1, 0xBC00BC00;\n mov.b32 m2, 0xC000C000;\n mov.b32 f4, 0x44004400;\n"
                     " mov.b32 f2, 0x40004000;\n mov.b32 big, 0x64006400;\n")
    _TAB16_ENC = (_ENC16_CONSTS + " prmt.b32 x, h, h, 0x1010;\n"
                  + _ENC16.format("x", "0x34000000", "ta") + _ENC16.format("h", "0x38003800", "tb")
                  + _ENC16.format("h", "0x3C003C00", "tc") + _ENC16.format("h", "0x40004000", "td")
                  + " prmt.b32 $0, ta, tb, 0x6420;\n prmt.b32 $1, tc, td, 0x6420;}")
    # The 4-bit requant's 8-entry table from a = d r and b = (1.5 d) r, two entries per f16x2
    # instruction: |a|, |b| rounded to fp16 by round-to-odd (toward zero, lowest bit set when
    # inexact), which keeps every comparison with the E2M1 decision points (3 significant bits,
    # 11 >= 3 + 2) and ties exactly; then the six-op encoder in f16x2 (the same exactness argument,
    # 1024 instead of 2^23 for the roundings). Bytes as requant._rq_table's: lo = (0, E(a/2), E(a), E(b)),
    # hi = (E(2a), E(2b), E(4a), E(4b)). test_gpu_e2m1_table16_exhaustive checks it on every
    # float32 in [0, 64] against the fp32 encoder.
    _TAB16_REGS = "{.reg .b32 h, x, k, m1, m2, f4, f2, big, u, v, w, t, ta, tb, tc, td;\n .reg .f32 xa, xb;\n"
    e2m1_table16 = asm(
        _TAB16_REGS + " .reg .b16 hl, hh;\n .reg .f32 fa, fb;\n .reg .pred pa, pb;\n abs.f32 xa, $2;\n abs.f32 xb, $3;\n"
        " cvt.rz.f16x2.f32 h, xb, xa;\n mov.b32 {hl, hh}, h;\n cvt.f32.f16 fa, hl;\n cvt.f32.f16 fb, hh;\n"
        " setp.neu.f32 pa, fa, xa;\n setp.neu.f32 pb, fb, xb;\n @pa or.b32 h, h, 1;\n @pb or.b32 h, h, 65536;\n"
        + _TAB16_ENC, "=r,=r,f,f", _t.UniTuple(_t.uint32, 2), (_t.float32, _t.float32))
    # e2m1_table16 for x, y >= 0 (no abs), the round-to-odd conversion by _RO16
    e2m1_table16q = asm(_TAB16_REGS + _RO16.format("$2", "$3", "h") + _TAB16_ENC,
                        "=r,=r,f,f", _t.UniTuple(_t.uint32, 2), (_t.float32, _t.float32))
    # The iso3 requant table from its four distinct products p_m = fl(fl(m d) r), m = 1, 3, 5, 7 (>= 0;
    # 2 d, 4 d, 6 d are exact doublings, so E(2m d r) = E(2 p_m)): the same round-to-odd fp16 and
    # f16x2 encoder as e2m1_table16q, 7 entries in 4 encodes instead of 7 fp32 ones (_rq_table32).
    # Bytes: lo = (0, E(p1), E(2 p1), E(p3)), hi = (E(4 p1), E(p5), E(2 p3), E(p7)).
    iso3_table16q = asm(
        "{.reg .b32 h1, h57, x, k, m1, m2, f4, f2, big, u, v, w, t, ta, tb, tc, td;\n .reg .f32 xa, xb;\n"
        + _RO16.format("$2", "$3", "h1") + _RO16.format("$4", "$5", "h57")
        + _ENC16_CONSTS + " prmt.b32 x, h1, h1, 0x1010;\n"
        + _ENC16.format("x", "0x38000000", "ta") + _ENC16.format("h1", "0x38003C00", "tb")
        + " prmt.b32 x, h1, h57, 0x5410;\n" + _ENC16.format("x", "0x38004000", "tc")
        + " prmt.b32 x, h1, h57, 0x7632;\n" + _ENC16.format("x", "0x38003C00", "td")
        + " prmt.b32 $0, ta, tb, 0x6420;\n prmt.b32 $1, tc, td, 0x6420;}",
        "=r,=r,f,f,f,f", _t.UniTuple(_t.uint32, 2), (_t.float32,) * 4)
    # e4m3_sat_bits's low byte alone (the high byte converts 0)
    e4m3_sat_byte = asm("{.reg .b16 t, z;\n mov.b16 z, 0;\n cvt.rn.satfinite.e4m3x2.f32 t, 0f00000000, $1;\n"
                        " mov.b32 $0, {t, z};}", "=r,f", _t.uint32, (_t.float32,))
    # IEEE x / 6 for 0 <= x <= 2^100: div.rn's own fast path (its FCHK passes in that range; 1/6's
    # refined reciprocal is 0x3E2AAAAB), without the check and the slow-path call
    fdiv6 = asm("{.reg .f32 q, r;\n fma.rn.f32 q, $1, 0f3E2AAAAB, 0f00000000;\n"
                " fma.rn.f32 r, q, 0fC0C00000, $1;\n fma.rn.f32 $0, r, 0f3E2AAAAB, q;}",
                "=f,f", _t.float32, (_t.float32,))
    # IEEE a / b for a in [2^-100, 2^100], b in [2^-9, 448]: div.rn's fast path (MUFU.RCP, one
    # Newton step, one correction), which div.rn uses whenever its FCHK passes
    fdivp = asm("{.reg .f32 c, e, q, r, nb;\n neg.f32 nb, $2;\n rcp.approx.ftz.f32 c, $2;\n"
                " fma.rn.f32 e, nb, c, 0f3F800000;\n fma.rn.f32 c, c, e, c;\n fma.rn.f32 q, $1, c, 0f00000000;\n"
                " fma.rn.f32 r, nb, q, $1;\n fma.rn.f32 $0, c, r, q;}",
                "=f,f,f", _t.float32, (_t.float32, _t.float32))
    # E4M3 by the sm_89+ conversions: one instruction each instead of ~25 (e4m3_enc) and ~12
    # (e4m3_dec) of integer work. e4m3_sat_bits(v) = e4m3_enc(min(v, 448)) in both low bytes for
    # v >= 0 (satfinite clamps to 448 as min() does; test_gpu_e4m3_conversions checks every float
    # of the binades that matter); e4m3_f32(b) = e4m3_dec(b & 0xFF) (via the exact fp16).
    e4m3_sat_bits = asm("{.reg .b16 t;\n cvt.rn.satfinite.e4m3x2.f32 t, $1, $1;\n cvt.u32.u16 $0, t;}",
                        "=r,f", _t.uint32, (_t.float32,))
    e4m3_f32 = asm("{.reg .b16 c, lo, hi;\n .reg .b32 t;\n cvt.u16.u32 c, $1;\n cvt.rn.f16x2.e4m3x2 t, c;\n"
                   " mov.b32 {lo, hi}, t;\n cvt.f32.f16 $0, lo;}", "=f,r", _t.float32, (_t.uint32,))
    # an estimate only (callers verify exactly): one MUFU instead of an IEEE division
    rcp_approx = asm("rcp.approx.ftz.f32 $0, $1;", "=f,f", _t.float32, (_t.float32,))
    # a & b & c as one LOP3 (ptxas split w & sg & 0x7F7F7F7F << 1 into two LOP3s and a shift)
    and3 = asm("lop3.b32 $0, $1, $2, $3, 0x80;", "=r,r,r,r", _t.uint32, (_t.uint32, _t.uint32, _t.uint32))
    # single FMA-pipe instructions for _i8_threshold: a saturated product / fma (.sat clamps to
    # [0, 1], NaN to 0), and an fma rounded toward +inf
    mul_sat = asm("mul.rn.sat.f32 $0, $1, $2;", "=f,f,f", _t.float32, (_t.float32, _t.float32))
    fma_sat = asm("fma.rn.sat.f32 $0, $1, $2, $3;", "=f,f,f,f", _t.float32, (_t.float32, _t.float32, _t.float32))
    fma_rp = asm("fma.rp.f32 $0, $1, $2, $3;", "=f,f,f,f", _t.float32, (_t.float32, _t.float32, _t.float32))


# 4-bit decode by byte tables: the fp32 value of every E2M1 / ISO3 code has only its top two bytes
# nonzero, so PRMT looks up byte 3 and byte 2 of 4 values at once (tables indexed by magnitude),
# a third PRMT turns the 4 sign bits into 0x80 bytes, and two more interleave the bytes into the
# top halves of the 4 floats: ~13 instructions per 4 values instead of ~36 by bit arithmetic.
_DEC_T3 = {NVFP4: (0x3F3F3F00, 0x40404040), ISO3: (0x40403F00, 0x40404040)}  # byte 3, m = 0..7
_DEC_T2 = {NVFP4: (0xC0800000, 0xC0804000), ISO3: (0x40008000, 0xE0C0A080)}  # byte 2
_DEC_T3[C4G64], _DEC_T2[C4G64] = _DEC_T3[NVFP4], _DEC_T2[NVFP4]


@cuda.jit(device=True)
def _dec4(t3lo, t3hi, t2lo, t2hi, w):
    """The 4 codes in the low 16 bits of w (code i in bits 4i..4i+3) as float32 (exactly
    e2m1_dec_bits / iso3_dec_bits, selected by the tables)."""
    x = _u32(w)
    sel = x & np.uint32(0x7777)
    b3 = _prmt(t3lo, t3hi, sel) | _prmt(0x8000, 0, (x >> np.uint32(3)) & np.uint32(0x1111))
    b2 = _prmt(t2lo, t2hi, sel)
    h01 = _u32(_prmt(b2, b3, 0x5140))  # bytes: b2[0] b3[0] b2[1] b3[1]
    h23 = _u32(_prmt(b2, b3, 0x7362))
    return (bits_f32(h01 << np.uint32(16)), bits_f32(h01 & np.uint32(0xFFFF0000)),
            bits_f32(h23 << np.uint32(16)), bits_f32(h23 & np.uint32(0xFFFF0000)))


# ---------------------------------------------------------------------------------- append
# Fast E2M1 packing (r finite; requant from int8 also s >= 0, so sign(value * r) = sign bit of
# the source): magnitudes from e2m1_mag_bits added at their nibbles (the 0x4B000000 biases of nibbles
# 0 and 1 sum to 0xFB000000, which the start value cancels; higher ones shift out), sign bits
# moved from the source words by PRMT: even values' signs to bit 3 of each byte, odd ones' to 7.
_MAG_BIAS = np.uint32(0x05000000)


@cuda.jit(device=True)
def _signs8(e, o):
    return (_u32(e) >> np.uint32(4)) & np.uint32(0x08080808) | _u32(o) & np.uint32(0x80808080)


def _make_append(F):
    """Quantize-append kernel for format F (same semantics as append_cpu; x [T, H, D] fp32, row
    (t, h) goes to table[h, (pos0 + t) // P]). Lane unit s = 16 consecutive values x.flat[16 s:]."""
    GL_FIXED = 4 if F == C4G64 else 1  # lanes sharing a scale (int8: D / 16, set at run time)
    GSH = 6 if F == C4G64 else 4

    @cuda_kernel
    def append(x, pos0, table, codes, scales, gscale):
        T, H, D = x.shape
        P = codes.shape[1]
        lane = cuda.threadIdx.x & 31
        ld, lh, lp = _log2(D), _log2(H), _log2(P)
        nseg = (T * H * D) >> 4
        gl = (D >> 4) if F == INT8 else GL_FIXED
        v = cuda.local.array(16, np.float32)  # constant indices after unrolling: registers
        c32 = codes.view(np.uint32)
        gw = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) >> 5
        nw = (cuda.gridDim.x * cuda.blockDim.x) >> 5
        for base in range(gw * 32, nseg, nw * 32):  # warp-uniform trip count: every lane shuffles
            s = base + lane
            live = s < nseg
            row = s >> (ld - 4)
            c = (s << 4) & (D - 1)
            t, h = _divmod(row, H, lh)
            m = 0
            if live:
                for k in range(4):
                    v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3] = _ld4(x, (t, h, c + 4 * k))
                for k in range(16):
                    m = max(m, _absbits(v[k]))
            if F >= 1:
                m = _warp_max_bits(m, gl)
            if not live:
                continue
            pi, pr = _divmod(pos0 + t, P, lp)
            page = table[h, pi]
            if page < 0:  # the host wrapper checks the table; a kernel cannot raise
                continue
            if F == BF16:  # 16 bf16 = 8 uint32 words
                for k in range(2):
                    _st4(c32, (page, pr, (c >> 1) + 4 * k),
                         (bf16_enc(v[8 * k]) | (bf16_enc(v[8 * k + 1]) << 16),
                          bf16_enc(v[8 * k + 2]) | (bf16_enc(v[8 * k + 3]) << 16),
                          bf16_enc(v[8 * k + 4]) | (bf16_enc(v[8 * k + 5]) << 16),
                          bf16_enc(v[8 * k + 6]) | (bf16_enc(v[8 * k + 7]) << 16)))
            elif F == INT8:  # 16 int8 = 4 uint32 words
                scale, inv = int8_row_scale(_amax_of_bits(m))
                if c == 0:
                    scales[page, pr, 0] = scale
                if inv > np.float32(0.0):
                    _st4(c32, (page, pr, c >> 2), (_int8_word(v, 0, inv), _int8_word(v, 4, inv),
                                                   _int8_word(v, 8, inv), _int8_word(v, 12, inv)))
                else:
                    _st4(c32, (page, pr, c >> 2), (0, 0, 0, 0))
            else:  # 16 4-bit codes = 2 uint32 words
                g = gscale[h]
                sb = group_scale(F, _amax_of_bits(m), g)
                r = group_mult(sb, g)
                lo = 0
                hi = 0
                if F != ISO3 and sb != E4M3_NAN and r <= F32_MAX:  # E2M1: the fast encoder
                    lo = _MAG_BIAS
                    hi = _MAG_BIAS
                    for j in range(8):
                        lo = _u32(lo + (e2m1_mag_bits(v[j] * r) << np.uint32(4 * j)))
                        hi = _u32(hi + (e2m1_mag_bits(v[8 + j] * r) << np.uint32(4 * j)))
                    for k in range(2):  # sign(v r) = sign(v): the sign bytes of values 8k..8k+7
                        b = (_u32(f32_bits(v[8 * k])), _u32(f32_bits(v[8 * k + 1])), _u32(f32_bits(v[8 * k + 2])),
                             _u32(f32_bits(v[8 * k + 3])), _u32(f32_bits(v[8 * k + 4])), _u32(f32_bits(v[8 * k + 5])),
                             _u32(f32_bits(v[8 * k + 6])), _u32(f32_bits(v[8 * k + 7])))
                        sg = _signs8(prmt(prmt(b[0], b[2], 0x73), prmt(b[4], b[6], 0x73), 0x5410),
                                     prmt(prmt(b[1], b[3], 0x73), prmt(b[5], b[7], 0x73), 0x5410))
                        if k == 0:
                            lo |= sg
                        else:
                            hi |= sg
                elif sb != E4M3_NAN:
                    for j in range(8):
                        lo |= _enc4(F, v[j], r) << (4 * j)
                        hi |= _enc4(F, v[8 + j], r) << (4 * j)
                _st2(c32, (page, pr, c >> 3), (lo, hi))
                if (c & ((1 << GSH) - 1)) == 0:
                    scales[page, pr, c >> GSH] = sb

    return append


# ---------------------------------------------------------------------------------- dequant
@cuda.jit(device=True)
def _dq_word(cw, wb, idx, nwp):
    """Code word idx of a page (flat base wb), 0 past the page's nwp words."""
    return np.uint64(_ldf(cw, wb + idx)) if idx < nwp else np.uint64(0)


@cuda.jit(device=True)
def _dq_words(cw, wb, i0, nwp):
    """The 8 code words of an iteration: lane's step k reads word i0 + 32 k."""
    return (_dq_word(cw, wb, i0, nwp), _dq_word(cw, wb, i0 + 32, nwp), _dq_word(cw, wb, i0 + 64, nwp),
            _dq_word(cw, wb, i0 + 96, nwp), _dq_word(cw, wb, i0 + 128, nwp), _dq_word(cw, wb, i0 + 160, nwp),
            _dq_word(cw, wb, i0 + 192, nwp), _dq_word(cw, wb, i0 + 224, nwp))


@cuda.jit(device=True)
def _dq_sbyte(scales, sb0, gi, ngp):
    return np.uint32(_ldf(scales, sb0 + gi)) if gi < ngp else np.uint32(0)


@cuda.jit(device=True)
def _dq_step(T3, T2, out, ob, q, pd, w, dsrc, src):
    """Step of a 4-bit dequant: the 4 values q..q+3 (code word w), the group step d held by lane
    src in dsrc (every lane calls: the shuffle needs the whole warp)."""
    d = cuda.shfl_sync(_FULL, dsrc, src)
    if q < pd:
        a0, a1, a2, a3 = _dec4(T3[0], T3[1], T2[0], T2[1], w)
        if abs(d) <= F32_MAX:  # finite step: finite codes times d are never NaN
            _stf4(out, ob + q, (a0 * d, a1 * d, a2 * d, a3 * d))
        else:  # poisoned group (NaN) or an infinite step (0 * inf): the CPU's NaN bits
            _stf4(out, ob + q, (_canon_nan(a0 * d), _canon_nan(a1 * d), _canon_nan(a2 * d), _canon_nan(a3 * d)))


@cuda.jit(device=True)
def _dq_store16(F, out, ob, q, pd, w, s):
    """bf16 / int8 step: values q..q+3 from code word w (int8: row scale s)."""
    if q < pd:
        if F == BF16:  # bf16 -> fp32 is a shift: exact, NaN payloads kept
            lo = _u32(w)
            hi = _u32(w >> np.uint64(32))
            _stf4(out, ob + q, (bits_f32(lo << np.uint32(16)), bits_f32(lo & np.uint32(0xFFFF0000)),
                                bits_f32(hi << np.uint32(16)), bits_f32(hi & np.uint32(0xFFFF0000))))
        else:
            x = _u32(w)
            a0, a1, a2, a3 = (_int8_code_f32(x), _int8_code_f32(x >> np.uint32(8)),
                              _int8_code_f32(x >> np.uint32(16)), _int8_code_f32(x >> np.uint32(24)))
            if abs(s) <= F32_MAX:
                _stf4(out, ob + q, (a0 * s, a1 * s, a2 * s, a3 * s))
            else:
                _stf4(out, ob + q, (_canon_nan(a0 * s), _canon_nan(a1 * s), _canon_nan(a2 * s), _canon_nan(a3 * s)))


@cuda.jit(device=True)
def _dq_rowscale(sf, r0, q, pd, ld):
    """int8: the fp32 scale of the row holding flat value q (0 past the page)."""
    return np.float32(_ldf(sf, r0 + (q >> ld))) if q < pd else np.float32(0.0)


def _make_dequant(F):
    """dequant kernel for format F: out[j] = page pages[j] decoded with global gs[j]; out float32
    [n, P, D]; a warp per page. Step k (0..7) of an iteration: a lane owns values q = base + 128 k
    + 4 lane .. q + 3 of the page (flat [P * D]), whose codes are one code word (uint16 4-bit,
    uint32 int8, uint64 bf16). The next iteration's words are loaded before this one is decoded.
    4-bit: lane i divides the step of group i (and i + 32) of the iteration once; the 4 lanes of a
    step that share a group fetch it with one shfl."""
    WT = np.uint64 if F == BF16 else (np.uint32 if F == INT8 else np.uint16)
    SH = 6 if F == C4G64 else 4  # 4-bit: log2 of the group
    T3, T2 = _DEC_T3.get(F, (0, 0)), _DEC_T2.get(F, (0, 0))

    @cuda_kernel
    def dequant(codes, scales, pages, gs, out):
        n, P, D = out.shape
        lane = cuda.threadIdx.x & 31
        ld = _log2(D)
        pd = P * D
        nwp = pd >> 2  # code words per page
        ngp = pd >> SH  # 4-bit: scale groups per page
        cw = codes.view(WT)
        gw = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) >> 5
        nw = (cuda.gridDim.x * cuda.blockDim.x) >> 5
        for j in range(gw, n, nw):
            page = np.int64(pages[j])
            g = np.float32(gs[j])
            wb = page * nwp
            ob = np.int64(j) * pd
            q0 = 4 * lane
            w = _dq_words(cw, wb, lane, nwp)
            if F <= INT8:
                r0 = page * P
                if F == INT8:
                    s = (_dq_rowscale(scales, r0, q0, pd, ld), _dq_rowscale(scales, r0, q0 + 128, pd, ld),
                         _dq_rowscale(scales, r0, q0 + 256, pd, ld), _dq_rowscale(scales, r0, q0 + 384, pd, ld),
                         _dq_rowscale(scales, r0, q0 + 512, pd, ld), _dq_rowscale(scales, r0, q0 + 640, pd, ld),
                         _dq_rowscale(scales, r0, q0 + 768, pd, ld), _dq_rowscale(scales, r0, q0 + 896, pd, ld))
                else:
                    z = np.float32(0.0)
                    s = (z, z, z, z, z, z, z, z)
                base = 0
                while base < pd:
                    wc, sc = w, s
                    if base + 1024 < pd:  # next iteration's loads in flight while this one decodes
                        w = _dq_words(cw, wb, ((base + 1024) >> 2) + lane, nwp)
                        if F == INT8:
                            qn = base + 1024 + q0
                            s = (_dq_rowscale(scales, r0, qn, pd, ld), _dq_rowscale(scales, r0, qn + 128, pd, ld),
                                 _dq_rowscale(scales, r0, qn + 256, pd, ld), _dq_rowscale(scales, r0, qn + 384, pd, ld),
                                 _dq_rowscale(scales, r0, qn + 512, pd, ld), _dq_rowscale(scales, r0, qn + 640, pd, ld),
                                 _dq_rowscale(scales, r0, qn + 768, pd, ld), _dq_rowscale(scales, r0, qn + 896, pd, ld))
                    q = base + q0
                    _dq_store16(F, out, ob, q, pd, wc[0], sc[0])
                    _dq_store16(F, out, ob, q + 128, pd, wc[1], sc[1])
                    _dq_store16(F, out, ob, q + 256, pd, wc[2], sc[2])
                    _dq_store16(F, out, ob, q + 384, pd, wc[3], sc[3])
                    _dq_store16(F, out, ob, q + 512, pd, wc[4], sc[4])
                    _dq_store16(F, out, ob, q + 640, pd, wc[5], sc[5])
                    _dq_store16(F, out, ob, q + 768, pd, wc[6], sc[6])
                    _dq_store16(F, out, ob, q + 896, pd, wc[7], sc[7])
                    base += 1024
            else:
                sb0 = page * ngp
                # scale bytes of the iteration's groups: 16-groups 64 (lane, lane + 32), 64-groups 16
                sa = _dq_sbyte(scales, sb0, lane, ngp if (SH == 4 or lane < 16) else 0)
                sb = _dq_sbyte(scales, sb0, lane + 32, ngp) if SH == 4 else np.uint32(0)
                base = 0
                while base < pd:
                    wc = w
                    da = e4m3_dec(np.int64(sa)) / g  # this lane's group steps s / g
                    db = e4m3_dec(np.int64(sb)) / g
                    if base + 1024 < pd:
                        w = _dq_words(cw, wb, ((base + 1024) >> 2) + lane, nwp)
                        gn = ((base + 1024) >> SH) + lane
                        sa = _dq_sbyte(scales, sb0, gn, ngp if (SH == 4 or lane < 16) else 0)
                        if SH == 4:
                            sb = _dq_sbyte(scales, sb0, gn + 32, ngp)
                    q = base + q0
                    if SH == 4:  # step k's group: 8 k + lane // 4 of the iteration
                        hl = lane >> 2
                        _dq_step(T3, T2, out, ob, q, pd, wc[0], da, hl)
                        _dq_step(T3, T2, out, ob, q + 128, pd, wc[1], da, 8 + hl)
                        _dq_step(T3, T2, out, ob, q + 256, pd, wc[2], da, 16 + hl)
                        _dq_step(T3, T2, out, ob, q + 384, pd, wc[3], da, 24 + hl)
                        _dq_step(T3, T2, out, ob, q + 512, pd, wc[4], db, hl)
                        _dq_step(T3, T2, out, ob, q + 640, pd, wc[5], db, 8 + hl)
                        _dq_step(T3, T2, out, ob, q + 768, pd, wc[6], db, 16 + hl)
                        _dq_step(T3, T2, out, ob, q + 896, pd, wc[7], db, 24 + hl)
                    else:  # 64-groups: step k's group is 2 k + lane // 16
                        hl = lane >> 4
                        _dq_step(T3, T2, out, ob, q, pd, wc[0], da, hl)
                        _dq_step(T3, T2, out, ob, q + 128, pd, wc[1], da, 2 + hl)
                        _dq_step(T3, T2, out, ob, q + 256, pd, wc[2], da, 4 + hl)
                        _dq_step(T3, T2, out, ob, q + 384, pd, wc[3], da, 6 + hl)
                        _dq_step(T3, T2, out, ob, q + 512, pd, wc[4], da, 8 + hl)
                        _dq_step(T3, T2, out, ob, q + 640, pd, wc[5], da, 10 + hl)
                        _dq_step(T3, T2, out, ob, q + 768, pd, wc[6], da, 12 + hl)
                        _dq_step(T3, T2, out, ob, q + 896, pd, wc[7], da, 14 + hl)
                    base += 1024

    return dequant


append_cuda = {f: _make_append(f) for f in FORMAT_IDS.values()}
dequant_pages_cuda = {f: _make_dequant(f) for f in FORMAT_IDS.values()}

# Device functions for other kernels (attention): decode one value, or a chunk into a local array.
decode_value_dev = cuda.jit(device=True)(decode_value)
dequantize_chunk_dev = cuda.jit(device=True)(dequantize_chunk)


# ---------------------------------------------------------------------------------- host launches
def _check_head_dim(head_dim: int) -> None:
    if head_dim < 64 or head_dim > 512 or head_dim & (head_dim - 1):
        raise ValueError(f"CUDA codec kernels need head_dim a power of two in 64..512, got {head_dim}")


_RESIDENT: dict = {}


def _grid(kernel, units: int, threads: int = 32 * _WARPS) -> int:
    """Blocks for `units` warp work units: at most as many as the device holds at once (a
    persistent grid; grid-stride loops take the rest), so no part-filled last wave of blocks
    idles the GPU. Residency comes from the occupancy API once the kernel is compiled (its first
    launch, which compiles it, uses a fixed cap)."""
    blocks = math.ceil(units * 32 / threads)
    if config.ENABLE_CUDASIM or not kernel.overloads:
        return min(blocks, _MAX_BLOCKS)
    key = (id(kernel), len(kernel.overloads), threads)
    if key not in _RESIDENT:
        try:
            _RESIDENT[key] = min(k.max_cooperative_grid_blocks(threads) for k in kernel.overloads.values())
        except Exception:  # no occupancy query on this driver / binding: the fixed cap
            _RESIDENT[key] = _MAX_BLOCKS
    return max(1, min(blocks, _RESIDENT[key]))


def _check_vec(*arrays) -> None:
    """The kernels move x, out and codes in 8/16-byte vectors along the last axis (_ld4/_st4)."""
    for a in arrays:
        if a.strides[-1] != a.dtype.itemsize or any(s % 16 for s in a.strides[:-1]):
            raise ValueError(f"CUDA codec kernels need the last axis contiguous and 16-byte aligned "
                             f"rows, got strides {a.strides}")


def _check_pages(*arrays) -> None:
    """dequant / requant address pages flat (base + offset): pools and outputs C-contiguous."""
    for a in arrays:
        contiguous = a.flags["C_CONTIGUOUS"] if hasattr(a, "flags") else a.is_c_contiguous()
        if a.size and not contiguous:
            raise ValueError("CUDA codec kernels need C-contiguous page arrays")


def launch_append(fmt_id, x, pos0, table, codes, scales, gscale, stream=0):
    """Quantize-append on the device (device or host arrays). The table must map every position."""
    T, H, D = x.shape
    _check_head_dim(D)
    _check_vec(x, codes)
    units = math.ceil(T * H * D / (16 * 32))  # a lane quantizes 16 values
    if not units:
        return
    k = append_cuda[int(fmt_id)]
    k[_grid(k, units), 32 * _WARPS, stream](x, pos0, table, codes, scales, gscale)


def launch_dequant_pages(fmt_id, codes, scales, pages, gs, out, stream=0):
    n, P, D = out.shape
    _check_head_dim(D)
    _check_vec(codes, out)
    _check_pages(codes, scales, out)
    if n * P:
        k = dequant_pages_cuda[int(fmt_id)]
        k[_grid(k, n), 32 * _WARPS, stream](codes, scales, pages, gs, out)



# ================================================================================== PTX check
_CODE_T = {BF16: "uint16", INT8: "int8", NVFP4: "uint8", ISO3: "uint8", C4G64: "uint8"}
_SCALE_T = {BF16: "uint8", INT8: "float32", NVFP4: "uint8", ISO3: "uint8", C4G64: "uint8"}


def _sigs():
    out = []
    for f in FORMAT_IDS.values():
        c, s = f"{_CODE_T[f]}[:,:,::1]", f"{_SCALE_T[f]}[:,:,::1]"
        out += [
            (append_cuda[f], f"void(float32[:,:,::1], int64, int32[:,::1], {c}, {s}, float32[::1])"),
            (dequant_pages_cuda[f], f"void({c}, {s}, int32[::1], float32[::1], float32[:,:,::1])"),
            (decode_value_dev, f"float32(int64, {c}, {s}, int64, int64, int64, float32)"),
            (dequantize_chunk_dev, f"void(int64, {c}, {s}, int64, int64, int64, int64, float32, "
                                   "float32[::1], int64)"),
        ]
    return out


PTX_SIGNATURES = _sigs()
