"""Requantize pages to c4g64 on the GPU: the cold pool's encoder (retired hot pages of any format
-> 64-value E2M1 groups with one fp32 global scale per page, computed from the page itself).

Same spec as quant.ref_requantize / quant.requant_c4g64_cpu, bit for bit. One kernel per source
format (`requant_c4g64_cuda`, built by `_make_requant`: a warp per page; bf16 by
`_make_requant_bf16`: a block per page), launched by `launch_requant_c4g64`.
Measurements and the design history are in docs/kernels_log.md ("Codec kernels", sessions 8, 9, 14);
the scalar cores, inline-PTX primitives and launch helpers it shares with append / dequant live in
quant.py.
"""
from __future__ import annotations

import numpy as np
from numba import cuda
from numba.extending import register_jitable

from coldkv.numba_kernels.jit_cache import cuda_kernel
from coldkv.numba_kernels.ptx import prmt
from coldkv.numba_kernels.quant import (  # the codec kernels' scalar cores, asm and launch helpers
    BF16, INT8, NVFP4, ISO3, C4G64, E4M3_NAN, F32_MAX, FORMAT_IDS, _CODE_T, _SCALE_T, _FULL,
    _MAG_BIAS, _WARPS, _check_head_dim, _check_pages, _check_vec, _decode_nibble, _grid,
    _ldf, _ldf4, _ldw, _log2, _prmt, _signs8, _stf, _stf4, _u32, and3, bits_f32, decode_value,
    e2m1_dec_bits, e2m1_enc_bits, e2m1_mag_bits, e2m1_table16, e2m1_table16q, e4m3_f32,
    e4m3_sat_bits, e4m3_sat_byte, f32_bits, fdiv6, fdivp, fma_rp, fma_sat, global_scale_for,
    iso3_dec_bits, iso3_table16q, max_s16x2, max_u16x2, min_s16x2, mul_sat, rcp_approx,
)


@cuda.jit(device=True)
def _lut_word(lo, hi, w):
    """8 output codes of source word w (8 nibbles) from the magnitude table hi:lo (byte m = code
    magnitude for source magnitude m): PRMT looks up nibbles 0-3 and 4-7 (sign bits cleared: a
    selector nibble's bit 3 means sign-replicate), r + (r >> 4) packs each pair of result bytes
    into one byte (magnitudes are < 8: no carries), a last PRMT gathers the four packed bytes."""
    x = _u32(w) & np.uint32(0x77777777)
    a = prmt(lo, hi, x)
    b = prmt(lo, hi, x >> np.uint32(16))
    return prmt(_u32(a + (a >> np.uint32(4))), _u32(b + (b >> np.uint32(4))), 0x6420)


@register_jitable
def _has7(x0, x1):
    """Whether any of the 16 nibbles of x0, x1 has code magnitude 7 (its three low bits set), by
    adds: (n & 7) + 1 carries into the nibble's bit 3 exactly when n & 7 == 7 (no carry leaves a
    nibble): two masks, two adds, one 3-input LOP3 (by shifts: four shifts and three LOP3s)."""
    a = _u32((_u32(x0) & np.uint32(0x77777777)) + np.uint32(0x11111111))
    b = _u32((_u32(x1) & np.uint32(0x77777777)) + np.uint32(0x11111111))
    return ((a | b) & np.uint32(0x88888888)) != np.uint32(0)


@register_jitable
def _max_mag16(w0, w1):
    """Largest code magnitude (low 3 bits of a nibble) among the 16 nibbles of w0, w1, bit by bit
    on all nibbles at once (SWAR): keep the nibbles that have the next bit when any has it."""
    x0 = _u32(w0) & np.uint32(0x77777777)
    x1 = _u32(w1) & np.uint32(0x77777777)
    # a group quantized from data almost always holds its top code (the scale maps its max near
    # the format's largest magnitude): test for magnitude 7 first
    if _has7(x0, x1):
        return np.int64(7)
    m = np.uint32(0)
    if ((x0 | x1) & np.uint32(0x44444444)) != np.uint32(0):
        m = np.uint32(4)
        x0 &= ((x0 >> np.uint32(2)) & np.uint32(0x11111111)) * np.uint32(15)
        x1 &= ((x1 >> np.uint32(2)) & np.uint32(0x11111111)) * np.uint32(15)
    if ((x0 | x1) & np.uint32(0x22222222)) != np.uint32(0):
        m |= np.uint32(2)
        x0 &= ((x0 >> np.uint32(1)) & np.uint32(0x11111111)) * np.uint32(15)
        x1 &= ((x1 >> np.uint32(1)) & np.uint32(0x11111111)) * np.uint32(15)
    if ((x0 | x1) & np.uint32(0x11111111)) != np.uint32(0):
        m |= np.uint32(1)
    return np.int64(m)


@cuda.jit(device=True)
def _rq_quarter_max(fmt, w0, w1, d):
    """Max |value| of 16 values of a 4-bit source (code words w0, w1, step d): |dec(largest
    magnitude) * d| (rounding is monotonic); not finite when the group holds a non-finite value."""
    return abs(_decode_nibble(fmt, _max_mag16(w0, w1), d))


@register_jitable
def _e2m1_mag(y):
    """E2M1 magnitude (0..7) of y (e2m1_enc_bits without the sign)."""
    return e2m1_enc_bits(y) & 7


@register_jitable
def _dec_code(fmt, c):
    return iso3_dec_bits(c) if fmt == 3 else e2m1_dec_bits(c)


@cuda.jit(device=True)
def _rq_table32(fmt, d, r):
    """_rq_table for r finite, any source: e2m1_mag_bits of each product summed at byte m (the
    0x4B000000 bias shifts out of bytes 1-3; byte 4 of hi subtracts it)."""
    lo = np.uint32(0)
    hi = np.uint32(e2m1_mag_bits(_dec_code(fmt, 4) * d * r) - np.uint32(0x4B000000))
    for m in range(1, 4):
        lo = _u32(lo + (e2m1_mag_bits(_dec_code(fmt, m) * d * r) << np.uint32(8 * m)))
        hi = _u32(hi + (e2m1_mag_bits(_dec_code(fmt, m + 4) * d * r) << np.uint32(8 * m)))
    return lo, hi


@cuda.jit(device=True)
def _rq_table(fmt, d, r):
    """8-byte table (lo, hi): byte m = E2M1 magnitude of dec(m) * d * r (m = source magnitude).
    E2M1 sources with d in range: e2m1_table16 of two products; else r finite: e2m1_mag_bits
    summed at byte m (the 0x4B000000 bias shifts out of bytes 1-3; byte 4 of hi subtracts it);
    else e2m1_enc_bits (any NaN encodes to magnitude 7, as the CPU does)."""
    ad = abs(d)
    if fmt != 3 and r <= F32_MAX and ad <= np.float32(2.0 ** 125) and (ad >= np.float32(2.0 ** -125) or d == 0):
        # E2M1 sources, d normal: dec(m) is 2^k or 1.5 * 2^k, so dec(m) d r = 2^k fl(d r) or
        # 2^k fl(fl(1.5 d) r) exactly (a product so small that the scaling rounds encodes to 0
        # either way); entries past the quarter's largest magnitude are never looked up
        lo, hi = e2m1_table16(d * r, (d * np.float32(1.5)) * r)
        return np.int64(lo), np.int64(hi)
    if r <= F32_MAX:
        lo, hi = _rq_table32(fmt, d, r)
        return np.int64(lo), np.int64(hi)
    lo = 0
    hi = 0
    for m in range(4):
        lo |= _e2m1_mag(_dec_code(fmt, m) * d * r) << (8 * m)
        hi |= _e2m1_mag(_dec_code(fmt, m + 4) * d * r) << (8 * m)
    return lo, hi


@cuda.jit(device=True)
def _rq_encode(lo, hi, w, d, r):
    """Output code word of source word w (8 codes, step d) by table lookup, signs as IEEE products."""
    x = np.int64(w)
    neg = 0x88888888 if ((f32_bits(d) ^ f32_bits(r)) >> 31) & 1 else 0
    return _lut_word(lo, hi, x) ^ (x & 0x88888888) ^ neg


# Source words of 64-value unit u of a page (flat code-word base wb), zeros past the page (nu
# units): (words, scale word, int8 row scale). int8 16 words + the fp32 scale of its row, 4-bit 8
# words + its scale byte(s) (c4g64 one, nvfp4/iso3 the 4 of its quarters as one word). Issued
# together: a thread has its whole unit in flight at once. One function per source width (numba
# types each function's return once); the two 4-bit ones from one factory.
@cuda.jit(device=True)
def _rq_load_half_bf16(c32, pages, j, h, wpp):
    """bf16: the 16 words of half-unit h (values 32h .. 32h + 31) of page pages[j]; zeros for j < 0."""
    if j < 0:
        z = np.uint32(0)
        z4 = (z, z, z, z)
        return z4 + z4 + z4 + z4
    b = np.int64(pages[j]) * wpp + 16 * h
    return _ldf4(c32, b) + _ldf4(c32, b + 4) + _ldf4(c32, b + 8) + _ldf4(c32, b + 12)


@cuda.jit(device=True)
def _rq_load_int8(c32, scales, wb, sb0, r0, u, nu, ld):
    z = np.uint32(0)
    if u >= nu:
        return (z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z), z, np.float32(0.0)
    b = wb + 16 * u
    return ((_ldf4(c32, b) + _ldf4(c32, b + 4) + _ldf4(c32, b + 8) + _ldf4(c32, b + 12)), z,
            np.float32(_ldf(scales, r0 + ((64 * u) >> ld))))


def _make_rq_load_4bit(g64: bool):
    """The 4-bit sources' loader: 8 code words and the unit's scale bytes (c4g64 its one byte,
    nvfp4/iso3 the 4 of its quarters as one word)."""
    @cuda.jit(device=True)
    def load(c32, scales, wb, sb0, r0, u, nu, ld):
        z = np.uint32(0)
        if u >= nu:
            return (z, z, z, z, z, z, z, z), z, np.float32(0.0)
        b = wb + 8 * u
        sw = np.uint32(_ldf(scales, sb0 + u)) if g64 else _ldw(scales, sb0 + 4 * u)
        return _ldf4(c32, b) + _ldf4(c32, b + 4), sw, np.float32(0.0)
    return load


_rq_load_g16, _rq_load_g64 = _make_rq_load_4bit(False), _make_rq_load_4bit(True)


_RQ_LOAD = {INT8: _rq_load_int8, NVFP4: _rq_load_g16, ISO3: _rq_load_g16,
            C4G64: _rq_load_g64}


@cuda.jit(device=True)
def _rq_step(F, stp, row, sw, q, g):
    """4-bit source: step s / g of quarter q (scale byte q of sw; c4g64: the unit's one byte),
    looked up in the page's table of the 128 positive steps (IEEE division is odd in its
    numerator: a negative byte's step is the negated entry)."""
    b = (_u32(sw) >> np.uint32(0 if F == C4G64 else 8 * q)) & np.uint32(0xFF)
    d = stp[row, b & np.uint32(0x7F)]
    return -d if b >= np.uint32(0x80) else d


@cuda.jit(device=True)
def _i8f(xb, k):
    """int8 code k (0..3) of a word whose bytes were XORed with 0x80 (biased codes), as float32:
    one PRMT moves the byte under 0x4B000000 (2^23 + 128 + code), one exact subtraction."""
    return bits_f32(_u32(_prmt(xb, 0x4B000000, 0x7440 | k))) - np.float32(8388736.0)


@cuda.jit(device=True)
def _bf16_m4(a, b, c, d, m):
    """Running max of |bits| of the bf16 halves of 4 words, two at a time (u16x2 lanes)."""
    k = np.uint32(0x7FFF7FFF)
    return max_u16x2(max_u16x2(m, _u32(a) & k), max_u16x2(_u32(b) & k, max_u16x2(_u32(c) & k, _u32(d) & k)))


@cuda.jit(device=True)
def _i8_m4(a, b, c, d, mx, mn):
    """Running max and min of the 16 int8 codes of 4 words, in the high bytes of s16x2 lanes: an
    s16 lane is 256 h + l (h its signed high byte, l in 0..255), so the lane max / min has the
    max / min h. x holds bytes 1, 3 high, x << 8 bytes 0, 2 (the shift can go to the FMA pipe's
    IMAD; sign-extending PRMTs were 2 more ALU-pipe instructions per word)."""
    for x in (a, b, c, d):
        x = _u32(x)
        e = _u32(x << np.uint32(8))
        mx = max_s16x2(mx, max_s16x2(x, e))
        mn = min_s16x2(mn, min_s16x2(x, e))
    return mx, mn


@cuda.jit(device=True)
def _rq_half_max_bf16(w):
    """Pass 1 of a bf16 half-unit (words w): its max |value| by an integer max of |bits|
    (monotonic), not finite when it holds a non-finite value (the kernel then takes the unit's
    finite max value by value, _rq_amax_slow). The other sources' group max of a whole unit:
    int8 max |code| times the row scale, 4-bit the top code times the largest step."""
    m = _bf16_m4(w[0], w[1], w[2], w[3], np.uint32(0))
    m = _bf16_m4(w[4], w[5], w[6], w[7], m)
    m = _bf16_m4(w[8], w[9], w[10], w[11], m)
    m = _bf16_m4(w[12], w[13], w[14], w[15], m)
    m = max(_u32(m) >> np.uint32(16), _u32(m) & np.uint32(0xFFFF))
    return bits_f32(m << np.uint32(16)) if m < np.uint32(0x7F80) else np.float32(np.inf)


@cuda.jit(device=True)
def _rq_max_int8(F, w, sw, s, stp, row, g):
    mx, mn = _i8_m4(w[0], w[1], w[2], w[3], np.uint32(0), np.uint32(0))
    mx, mn = _i8_m4(w[4], w[5], w[6], w[7], mx, mn)
    mx, mn = _i8_m4(w[8], w[9], w[10], w[11], mx, mn)
    mx, mn = _i8_m4(w[12], w[13], w[14], w[15], mx, mn)
    mx = max_s16x2(mx, _u32(mx) >> np.uint32(16))  # byte 1: the largest code
    mn = min_s16x2(mn, _u32(mn) >> np.uint32(16))  # byte 1: the smallest
    xb = _u32(prmt(mx, mn, 0x0051)) ^ np.uint32(0x8080)  # both, biased, in bytes 0 and 1
    mc = max(_i8f(xb, 0), -_i8f(xb, 1))  # max |code|, 0..128, exact (32-bit, no 64-bit min/max)
    return abs(mc * s)  # |code| <= 128: rounding is monotonic, so this is the max |value|


@cuda.jit(device=True)
def _rq_max_4bit(F, w, sw, s, stp, row, g):
    # A group quantized from data holds its top code in every source group (the scale maps each
    # group's max near the largest magnitude): then the max |value| is dec(7) times the largest
    # |step|, and |step| grows with the scale byte's low 7 bits (E4M3 order; a NaN byte, 0x7F, is
    # the largest and gives NaN: the slow path). One lookup instead of four quarter maxima.
    if F == C4G64:  # one source group: its largest code magnitude times its one step
        d = _rq_step(F, stp, row, sw, 0, g)
        if _has7(w[0], w[1]) or _has7(w[2], w[3]) or _has7(w[4], w[5]) or _has7(w[6], w[7]):
            # |dec(7) d| = 6 |d| (NaN for a NaN step: its payload never matters, the caller only
            # tests the max for finiteness)
            return abs(d) * np.float32(6.0)
        m = max(max(_max_mag16(w[0], w[1]), _max_mag16(w[2], w[3])),
                max(_max_mag16(w[4], w[5]), _max_mag16(w[6], w[7])))
        return abs(_decode_nibble(F, m, d))  # NaN / inf (a NaN byte, a huge step): the slow path
    if _has7(w[0], w[1]) and _has7(w[2], w[3]) and _has7(w[4], w[5]) and _has7(w[6], w[7]):
        b = _u32(sw) & np.uint32(0x7F7F7F7F)
        b = max_u16x2(b & np.uint32(0x00FF00FF), (b >> np.uint32(8)) & np.uint32(0x00FF00FF))
        b = max_u16x2(b, b >> np.uint32(16)) & np.uint32(0xFF)  # 32-bit (max() of these was 64-bit)
        return abs(stp[row, b]) * np.float32(7.0 if F == ISO3 else 6.0)  # = |dec(7) d|; NaN payload as above
    m0 = _rq_quarter_max(F, w[0], w[1], _rq_step(F, stp, row, sw, 0, g))
    m1 = _rq_quarter_max(F, w[2], w[3], _rq_step(F, stp, row, sw, 1, g))
    m2 = _rq_quarter_max(F, w[4], w[5], _rq_step(F, stp, row, sw, 2, g))
    m3 = _rq_quarter_max(F, w[6], w[7], _rq_step(F, stp, row, sw, 3, g))
    if m0 <= F32_MAX and m1 <= F32_MAX and m2 <= F32_MAX and m3 <= F32_MAX:
        return max(max(m0, m1), max(m2, m3))
    return np.float32(np.inf)


@cuda.jit(device=True)
def _rq_amax_slow(F, codes, scales, page, u, ld, g):
    """Finite max |value| of unit u of a page, value by value (a group holding a non-finite
    value: rare, so one out-of-line copy that reads memory again)."""
    row = (64 * u) >> ld
    c0 = (64 * u) & ((1 << ld) - 1)
    amax = np.float32(0.0)
    for i in range(64):
        a = abs(decode_value(F, codes, scales, page, row, c0 + i, g))
        if a <= F32_MAX and a > amax:
            amax = a
    return amax


@cuda.jit(device=True)
def _rq_out_scale(gm, g2):
    """(E4M3 scale byte, multiplier r) of an output 64-group with max |value| gm: group_scale and
    group_mult of c4g64 (NaN byte for a non-finite gm), with the hardware E4M3 conversions."""
    if not (gm <= F32_MAX):
        return np.uint32(E4M3_NAN), np.float32(0.0)
    sb = e4m3_sat_bits(g2 * gm / np.float32(6.0)) & np.uint32(0xFF)
    s = e4m3_f32(sb)
    return sb, (g2 / s if s > np.float32(0.0) else np.float32(0.0))


@cuda.jit(device=True)
def _bf16_enc4(a, b, c, d, r):
    """Output code word of 8 bf16 values (4 source words) times r."""
    acc = np.uint32(0)
    sh = np.uint32(0)
    for x in (a, b, c, d):
        x = _u32(x)
        acc |= np.uint32(e2m1_enc_bits(bits_f32(x << np.uint32(16)) * r)) << sh
        acc |= np.uint32(e2m1_enc_bits(bits_f32(x & np.uint32(0xFFFF0000)) * r)) << (sh + np.uint32(4))
        sh += np.uint32(8)
    return acc


@cuda.jit(device=True)
def _i8_enc2(a, b, s, r):
    """Output code word of 8 int8 values (2 source words), row scale s, times r."""
    xa = _u32(a) ^ np.uint32(0x80808080)
    xb = _u32(b) ^ np.uint32(0x80808080)
    acc = np.uint32(0)
    for k in range(4):
        acc |= np.uint32(e2m1_enc_bits((_i8f(xa, k) * s) * r)) << np.uint32(4 * k)
        acc |= np.uint32(e2m1_enc_bits((_i8f(xb, k) * s) * r)) << np.uint32(4 * k + 16)
    return acc


@cuda.jit(device=True)
def _bf16_enc8(a, b, c, d, r):
    acc = _MAG_BIAS
    sh = np.uint32(0)
    for x in (a, b, c, d):
        x = _u32(x)
        acc = _u32(acc + (e2m1_mag_bits(bits_f32(x << np.uint32(16)) * r) << sh))
        acc = _u32(acc + (e2m1_mag_bits(bits_f32(x & np.uint32(0xFFFF0000)) * r) << (sh + np.uint32(4))))
        sh += np.uint32(8)
    lo = prmt(a, b, 0x7351)  # bytes 1 and 3 (the sign bytes) of a and b, then of c and d
    hi = prmt(c, d, 0x7351)
    return acc | _signs8(prmt(lo, hi, 0x5410), prmt(lo, hi, 0x7632))


# int8 -> E2M1 by thresholds. For a unit's row scale s >= 0 and multiplier r, the output magnitude
# E2M1(fl(fl(c s) r)) is a non-decreasing step function of |c| (both roundings are monotonic and
# the sign is the code's), so it is fixed by 7 thresholds t_k = the least |c| whose magnitude is
# >= k. They are found once per unit: an estimate ceil(b_k / (s r)) (b_k the E2M1 decision points;
# odd k need y > b_k, even k y >= b_k: ties go to the even code) is within one of t_k for |c| <=
# 128, and two exact evaluations pick it. Then each value is 3 byte-parallel compares in a binary
# search (4 values per instruction; PRMT turns bit 7 of each byte into a byte mask): ~5
# instructions per value instead of ~12 for decode, two multiplies and the six-op encoder.
# The int8 kernel is bound by the ALU pipe (half the FMA pipe's rate on sm_90; ncu), so the
# thresholds are computed by float ops alone (FMA pipe; the int32 version compiled to ~14
# ALU-pipe instructions each, its sums widened to 64 bits).
_I8_B = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_I8_M = 12582912.0  # 1.5 * 2^23: integers near it are floats with ulp 1 (bits 0x4B400000 + n)
_I8_TB = np.uint32((-0x4B400000 * 0x01010101 - 0x80808080) & 0xFFFFFFFF)  # see _i8_threshold
_I8_K = tuple(np.uint32((-w * 272 * 0x01010101) & 0xFFFFFFFF) for w in (1, 2, 4, 8))  # see _i8_mag4


@cuda.jit(device=True)
def _i8_threshold(s, r, inv, b, q):
    """t_k (1..128; 128: never, as the codes compared are <= 127) as 4 equal bytes, minus
    0x80808080 (_i8_mag4 compares |c| + 0x80 per byte); q = 1 for the strict test y > b (odd k),
    -1 for y >= b (even k). For s > 0, r >= 0 finite (_rq_emit_int8). All FMA-pipe float ops:
    c0 = ceil(min(b inv, 127)) by one fma rounding up at 1.5 * 2^23 + q (the clamp to 127 keeps
    t <= 128: c0 + 1 <= 128), f0 = c0, and the test results as 0 / 1 by saturation: y and b are
    floats >= 2^-26 apart when they differ, so sat((y - b) 2^30) is [y > b] and sat((b - y) 2^30)
    is [y < b] (a NaN y, r = 0 with a huge s, only comes with all codes 0, any t >= 1 fits).
    Then t = c0 + 1 - [y0 > b] - [y1 > b], or c0 - 1 + [y0 < b] + [y1 < b]: ulp-1 float
    arithmetic on m, whose bits are 0x4B400000 + t at the end."""
    cm = np.float32(_I8_M) + q
    m = fma_rp(mul_sat(inv, b * np.float32(1.0 / 127.0)), np.float32(127.0), cm)
    f0 = m - cm
    y0 = ((m - (cm + np.float32(1.0))) * s) * r  # f0 - 1, exactly
    y1 = (f0 * s) * r
    k = q * np.float32(2.0 ** 30)
    m = m - q * fma_sat(y0, k, -k * b)
    m = m - q * fma_sat(y1, k, -k * b)
    return _u32(f32_bits(m) * np.uint32(0x01010101) + _I8_TB)


@cuda.jit(device=True)
def _i8_thresholds(s, r):
    inv = rcp_approx(s * r)
    p = np.float32(1.0)
    n = np.float32(-1.0)
    t1 = _i8_threshold(s, r, inv, np.float32(_I8_B[0]), p)
    t2 = _i8_threshold(s, r, inv, np.float32(_I8_B[1]), n)
    t3 = _i8_threshold(s, r, inv, np.float32(_I8_B[2]), p)
    t4 = _i8_threshold(s, r, inv, np.float32(_I8_B[3]), n)
    t5 = _i8_threshold(s, r, inv, np.float32(_I8_B[4]), p)
    t6 = _i8_threshold(s, r, inv, np.float32(_I8_B[5]), n)
    t7 = _i8_threshold(s, r, inv, np.float32(_I8_B[6]), p)
    return t1, t2, t3, t4, t5, t6, t7, t2 ^ t6, t1 ^ t3, t5 ^ t7


@cuda.jit(device=True)
def _i8_mag4(w, t):
    """Output codes of the 4 int8 codes of w (none -128) for thresholds t = (t1..t7, t2 ^ t6,
    t1 ^ t3, t5 ^ t7), each minus 0x80808080 (so x - t is 0x80 + |c| - t_k per byte, bit 7 the
    test, no borrows), times 272: code i (sign bit 3, magnitude 0..7) in byte i + 1, plus code
    i + 1 times 16 (_i8_word gathers bytes 1 and 3). A select between thresholds is
    x ^ ((x ^ y) & m): one LOP3."""
    w = _u32(w)
    sg = _u32(prmt(w, 0, 0xBA98))  # 0xFF per negative byte
    # |c| per byte: w - 2 (w & 0x7F) over the negative bytes ((c + 256) - 2 (c + 128) = -c; the
    # 32-bit sum is the bytes' sum, no carries): one LOP3 and a shift and subtract ptxas puts on IMAD
    x = _u32(w - _u32(and3(w, sg, 0x7F7F7F7F) << np.uint32(1)))
    m1 = prmt(_u32(x - t[3]), 0, 0xBA98)  # |c| >= t4
    m2 = prmt(_u32(x - (t[1] ^ (t[7] & m1))), 0, 0xBA98)  # >= t6 | t2
    hi = t[4] ^ (t[9] & m2)  # t7 | t5
    lo = t[0] ^ (t[8] & m2)  # t3 | t1
    m3 = prmt(_u32(x - (lo ^ ((hi ^ lo) & m1))), 0, 0xBA98)
    # The codes by IMAD (FMA pipe) instead of 4 LOP3s and a LEA (ALU pipe): each mask is 255 B
    # (B its 0 / 1 bytes), so 8 sg + 4 m1 + 2 m2 + m3 = 255 V, V the code bytes, and 255 has the
    # inverse -0x01010101 mod 2^32; 272 V = 16 V + 256 V packs codes i, i + 1 into byte i + 1.
    return _u32(sg * _I8_K[3] + m1 * _I8_K[2] + m2 * _I8_K[1] + m3 * _I8_K[0])


@cuda.jit(device=True)
def _i8_word(a, b, t):
    """Output code word of 8 int8 values (source words a, b) by thresholds t."""
    return prmt(_i8_mag4(a, t), _i8_mag4(b, t), 0x7531)


@cuda.jit(device=True)
def _rq_emit_half_bf16(w, r, o32, ob):
    """Pass 2 of a bf16 half-unit with output multiplier r (scale not NaN): its 16 code bytes
    (output word k holds values 8k .. 8k+7 = source words 4k .. 4k+3)."""
    if r <= F32_MAX:
        _stf4(o32, ob, (_bf16_enc8(w[0], w[1], w[2], w[3], r), _bf16_enc8(w[4], w[5], w[6], w[7], r),
                        _bf16_enc8(w[8], w[9], w[10], w[11], r), _bf16_enc8(w[12], w[13], w[14], w[15], r)))
    else:
        _stf4(o32, ob, (_bf16_enc4(w[0], w[1], w[2], w[3], r), _bf16_enc4(w[4], w[5], w[6], w[7], r),
                        _bf16_enc4(w[8], w[9], w[10], w[11], r), _bf16_enc4(w[12], w[13], w[14], w[15], r)))


@cuda.jit(device=True)
def _rq_emit_int8(F, w, sw, s, stp, row, g, gm, r, o32, ob):
    """Pass 2 of one 64-value unit with output multiplier r (scale not NaN): its 32 code bytes;
    int8: output word k from source words 2k, 2k+1. By thresholds unless r
    is not finite, s is negative or NaN, or a code is -128 (|c| 128: the max |value| is 128 s)."""
    if r <= F32_MAX and s >= np.float32(0.0) and gm != abs(np.float32(128.0) * s):
        t = _i8_thresholds(s, r)
        _stf4(o32, ob, (_i8_word(w[0], w[1], t), _i8_word(w[2], w[3], t),
                        _i8_word(w[4], w[5], t), _i8_word(w[6], w[7], t)))
        _stf4(o32, ob + 4, (_i8_word(w[8], w[9], t), _i8_word(w[10], w[11], t),
                            _i8_word(w[12], w[13], t), _i8_word(w[14], w[15], t)))
        return
    _stf4(o32, ob, (_i8_enc2(w[0], w[1], s, r), _i8_enc2(w[2], w[3], s, r),
                    _i8_enc2(w[4], w[5], s, r), _i8_enc2(w[6], w[7], s, r)))
    _stf4(o32, ob + 4, (_i8_enc2(w[8], w[9], s, r), _i8_enc2(w[10], w[11], s, r),
                        _i8_enc2(w[12], w[13], s, r), _i8_enc2(w[14], w[15], s, r)))
    return


@cuda.jit(device=True)
def _rq_emit_4bit(F, w, sw, s, stp, row, g, gm, r, o32, ob):
    """As _rq_emit_int8; 4-bit sources by code tables."""
    d0 = _rq_step(F, stp, row, sw, 0, g)
    lo, hi = _rq_table(F, d0, r)
    o0, o1 = _rq_encode(lo, hi, w[0], d0, r), _rq_encode(lo, hi, w[1], d0, r)
    if F == C4G64:  # one source group: one step, one table
        o2, o3 = _rq_encode(lo, hi, w[2], d0, r), _rq_encode(lo, hi, w[3], d0, r)
        o4, o5 = _rq_encode(lo, hi, w[4], d0, r), _rq_encode(lo, hi, w[5], d0, r)
        o6, o7 = _rq_encode(lo, hi, w[6], d0, r), _rq_encode(lo, hi, w[7], d0, r)
    else:  # nvfp4 / iso3: a table per 16-value source group
        d1 = _rq_step(F, stp, row, sw, 1, g)
        lo, hi = _rq_table(F, d1, r)
        o2, o3 = _rq_encode(lo, hi, w[2], d1, r), _rq_encode(lo, hi, w[3], d1, r)
        d2 = _rq_step(F, stp, row, sw, 2, g)
        lo, hi = _rq_table(F, d2, r)
        o4, o5 = _rq_encode(lo, hi, w[4], d2, r), _rq_encode(lo, hi, w[5], d2, r)
        d3 = _rq_step(F, stp, row, sw, 3, g)
        lo, hi = _rq_table(F, d3, r)
        o6, o7 = _rq_encode(lo, hi, w[6], d3, r), _rq_encode(lo, hi, w[7], d3, r)
    _stf4(o32, ob, (o0, o1, o2, o3))
    _stf4(o32, ob + 4, (o4, o5, o6, o7))


@cuda.jit(device=True)
def _rq_out_scale_fast(gm, g2):
    """_rq_out_scale for finite gm >= 0 and g2 in [2^-100, 2^100] (a fast page): the divisions
    by div.rn's fast path (x = g2 gm <= 2688(1 + 2^-23); s in [2^-9, 448]; a tiny x gives byte 0
    however its quotient rounds), no NaN byte."""
    sb = e4m3_sat_byte(fdiv6(g2 * gm))
    s = e4m3_f32(sb)
    q = fdivp(g2, s)
    return sb, (q if s > np.float32(0.0) else np.float32(0.0))


@cuda.jit(device=True)
def _rq_unit_scale(gm, g2, g2ok):
    """(scale byte, multiplier) of an output group with max gm on a page of global scale g2
    (g2ok: in [2^-100, 2^100]): the fast divisions when they apply. Tested here, not inside
    _rq_out_scale: there ptxas spilled 20 bytes in the old bf16 kernel (8 here)."""
    if g2ok and gm <= F32_MAX:
        return _rq_out_scale_fast(gm, g2)
    return _rq_out_scale(gm, g2)


@cuda.jit(device=True)
def _rq_quarter_fast(F, srow, b, nm, r, w0, w1):
    """Output words of source words w0, w1 (scale byte b & 0x7F's step in srow, the warp's row of
    the step table; nm = 0xFFFFFFFF when the byte is negative, else 0) on a fast page: steps >= 0
    and in e2m1_table16's range (checked once per page), r finite, so the table has no branch and
    no abs, and the sign of d r is the byte's sign bit."""
    d = srow[b & np.uint32(0x7F)]
    if F == ISO3:  # magnitudes 1..7 times d: four distinct products (2, 4, 6 are doublings)
        lo, hi = iso3_table16q(d * r, (d * np.float32(3.0)) * r, (d * np.float32(5.0)) * r,
                               (d * np.float32(7.0)) * r)
    else:
        lo, hi = e2m1_table16q(d * r, (d * np.float32(1.5)) * r)
    x0 = _u32(w0)
    x1 = _u32(w1)
    m = np.uint32(0x88888888)
    return (_u32(_lut_word(lo, hi, x0)) ^ ((x0 ^ nm) & m), _u32(_lut_word(lo, hi, x1)) ^ ((x1 ^ nm) & m))


@cuda.jit(device=True)
def _rq_emit_4bit_fast(F, w, sw, srow, r, o32, ob):
    """_rq_emit_4bit on a fast page."""
    x = _u32(sw)
    if F == C4G64:
        nm = _u32(prmt(x, 0, 0x8888))  # byte 0's sign in every bit
        o0, o1 = _rq_quarter_fast(F, srow, x, nm, r, w[0], w[1])
        o2, o3 = _rq_quarter_fast(F, srow, x, nm, r, w[2], w[3])
        o4, o5 = _rq_quarter_fast(F, srow, x, nm, r, w[4], w[5])
        o6, o7 = _rq_quarter_fast(F, srow, x, nm, r, w[6], w[7])
    else:
        o0, o1 = _rq_quarter_fast(F, srow, x, _u32(prmt(x, 0, 0x8888)), r, w[0], w[1])
        o2, o3 = _rq_quarter_fast(F, srow, x >> np.uint32(8), _u32(prmt(x, 0, 0x9999)), r, w[2], w[3])
        o4, o5 = _rq_quarter_fast(F, srow, x >> np.uint32(16), _u32(prmt(x, 0, 0xAAAA)), r, w[4], w[5])
        o6, o7 = _rq_quarter_fast(F, srow, x >> np.uint32(24), _u32(prmt(x, 0, 0xBBBB)), r, w[6], w[7])
    _stf4(o32, ob, (o0, o1, o2, o3))
    _stf4(o32, ob + 4, (o4, o5, o6, o7))


_RQ_KEEP = {INT8: 4, NVFP4: 4, ISO3: 4, C4G64: 4}  # 64-value units a lane keeps in registers
# bf16 (_make_requant_bf16): a block of 8 warps per page, half a unit (16 words) a thread, and the
# block's next page loaded during this one
_BF16_WARPS = 8
# 72 registers: 3 blocks an SM and no spill. H200 at 693f8b1, 5 rounds: 0.403 ms (0.76x copy) against
# 0.413 at 64 (4 blocks, 8 B spill), every round (bench/results/logs/codecs_requant_ab_693f8b1.json)
_BF16_REGS = 72


def _make_requant(F):
    """Requantize-to-c4g64 kernel for source format F: page pages[j] (global gsrc[j]) -> out_*[j];
    a warp per page, no block barrier (launch_requant_c4g64). bf16 has its own kernel
    (_make_requant_bf16).

    Lane l owns output 64-groups (units) u = l, l + 32, ...: it loads its first _RQ_KEEP[F] units
    at once (4-bit 4 x 32 B, int8 4 x 64 B + row scales) and keeps them in
    registers: pass 1 takes each group max (the lane holds the whole group: no shuffles) and the
    finite page amax (5 shfl_xor), pass 2 encodes from the registers. Units past those (pages of
    more than 32 x _RQ_KEEP units) are read again in pass 2. A warp per page, rather than a block,
    spends the per-page work (steps, amax, global scale, addresses) once per 128 or more units
    instead of once per 32, and has no barrier (ncu at 0f97dd9: that overhead was ~540 of ~880
    instructions per thread and page from nvfp4, a block per page). Pass 2 is a loop, not
    unrolled, and groups holding a non-finite value take one out-of-line path (_rq_amax_slow), so
    the hot code stays small (unrolled it stalled on instruction fetch; docs/kernels_log.md, "Codec kernels, session 9").
    4-bit sources: steps s / g come from the warp's shared table of the 128 positive
    E4M3 steps (4 IEEE divisions per lane and page instead of 4 per unit). The output code is a
    function of the source code magnitude within a (source group, output group) pair: an 8-byte
    table (m -> E2M1 magnitude of dec(m) * d * r) built per source group (e2m1_table16, two
    entries per f16x2 instruction) and looked up 4 codes at a time with PRMT (_rq_table /
    _rq_encode). A page whose g and g2 are in range (almost every page) takes the fast-page loop
    instead: two units per iteration, branch-free tables, divisions by div.rn's fast path
    (_rq_emit_4bit_fast, _rq_out_scale_fast). int8 by 7 thresholds per unit (_i8_word); the
    integer encoder only when r is not finite. Output scales by the hardware E4M3 conversions.
    """
    load = _RQ_LOAD[F]
    K = _RQ_KEEP[F]
    STEPS = F == NVFP4 or F == ISO3 or F == C4G64
    FAST = F == NVFP4 or F == ISO3 or F == C4G64  # 4-bit sources: the fast-page loop (see below)
    umax = _rq_max_int8 if F == INT8 else _rq_max_4bit
    emit = _rq_emit_int8 if F == INT8 else _rq_emit_4bit

    @cuda.jit(device=True)
    def unit(w, sw, s, gm, stp, row, g, g2, g2ok, o32, out_scales, ob, osb, u):
        """Pass 2 of unit u (group max gm): its scale byte, then its codes (zeros if poisoned)."""
        sb, r = _rq_unit_scale(gm, g2, g2ok)
        _stf(out_scales, osb + u, sb)
        if sb == E4M3_NAN:  # a poisoned group: zero codes
            _stf4(o32, ob + 8 * u, (0, 0, 0, 0))
            _stf4(o32, ob + 8 * u + 4, (0, 0, 0, 0))
        else:
            emit(F, w, sw, s, stp, row, g, gm, r, o32, ob + 8 * u)

    # 16 warps per SM (nvfp4 takes 137 registers uncapped; no spills at 128)
    @cuda_kernel(max_registers=128)
    def requant(codes, scales, pages, gsrc, out_codes, out_scales, out_g):
        P = codes.shape[1]
        D = out_codes.shape[2] * 2
        lane = cuda.threadIdx.x & 31
        wid = cuda.threadIdx.x >> 5
        nwb = _WARPS  # warps (pages at a time) per block: launch_requant_c4g64's blocks, a constant so
        # that the divisions by T below are shifts (a 64-bit division call per page and thread before)
        ld = _log2(D)
        c32 = codes.view(np.uint32)
        o32 = out_codes.view(np.uint32)
        stp = cuda.shared.array((_WARPS, 128), np.float32)  # 4-bit: this warp's steps by byte
        t = lane  # a page's threads: its warp
        T = 32
        row = wid  # step-table row
        pd = P * D
        nu = pd >> 6  # 64-value units (output groups) of a page
        wpp = (P * codes.shape[2] * codes.itemsize) >> 2  # uint32 code words per page
        spp = pd >> (6 if F == C4G64 else 4)  # 4-bit: scale bytes per page
        nk = min(nu, T * K)  # units kept in registers
        z = np.float32(0.0)
        j = cuda.blockIdx.x * nwb + wid
        while j < pages.shape[0]:
            page = np.int64(pages[j])
            g = np.float32(gsrc[j])
            wb = page * wpp
            sb0 = page * spp
            r0 = page * P
            # all of this page's kept units in flight at once (a unit past nk loads nothing: zeros)
            w0, sw0, s0 = load(c32, scales, wb, sb0, r0, t, nk, ld)
            w1, sw1, s1 = load(c32, scales, wb, sb0, r0, t + T, nk if K > 1 else 0, ld)
            w2, sw2, s2 = load(c32, scales, wb, sb0, r0, t + 2 * T, nk if K > 2 else 0, ld)
            w3, sw3, s3 = load(c32, scales, wb, sb0, r0, t + 3 * T, nk if K > 3 else 0, ld)
            if STEPS:
                cuda.syncwarp()  # the previous page's lookups are done
                for b in range(t, 128, T):
                    stp[row, b] = e4m3_f32(b) / g
                cuda.syncwarp()
            gm0 = umax(F, w0, sw0, s0, stp, row, g)
            gm1 = umax(F, w1, sw1, s1, stp, row, g) if K > 1 else z
            gm2 = umax(F, w2, sw2, s2, stp, row, g) if K > 2 else z
            gm3 = umax(F, w3, sw3, s3, stp, row, g) if K > 3 else z
            amax = max(max(gm0, gm1), max(gm2, gm3))
            nl = (nu - t + T - 1) // T if t < nu else 0  # units of this thread
            fin = gm0 <= F32_MAX and gm1 <= F32_MAX and gm2 <= F32_MAX and gm3 <= F32_MAX
            if not fin or nl > K:  # non-finite groups (rare), or large pages
                amax = z
                for k in range(nl):
                    gm = gm0 if k == 0 else (gm1 if k == 1 else (gm2 if k == 2 else gm3))
                    if k >= K:
                        w, sw, s = load(c32, scales, wb, sb0, r0, t + T * k, nu, ld)
                        gm = umax(F, w, sw, s, stp, row, g)
                    if not (gm <= F32_MAX):
                        gm = _rq_amax_slow(F, codes, scales, page, t + T * k, ld, g)
                    amax = max(amax, gm)
            for sh in (16, 8, 4, 2, 1):
                amax = max(amax, cuda.shfl_xor_sync(_FULL, amax, sh))
            g2 = global_scale_for(amax)
            if t == 0:
                out_g[j] = g2
            ob = np.int64(j) * (pd >> 3)  # output uint32 words
            osb = np.int64(j) * nu  # output scale bytes (one per unit)
            g2ok = g2 >= np.float32(2.0 ** -100) and g2 <= np.float32(2.0 ** 100)
            if FAST:
                # a fast page: g in [2^-110, 2^110], so every step e4m3(b) / g but the NaN byte's
                # is +0 or in [2^-119, 2^119] (e2m1_table16's range, >= 0: no abs, the byte's sign
                # bit is the sign of d r); g2 in [2^-100, 2^100], so r = g2 / s is finite and both
                # divisions take div.rn's fast path. A unit with a NaN byte has a NaN group max
                # (fin is false). Page-uniform: no divergence.
                pf = g >= np.float32(2.0 ** -110) and g <= np.float32(2.0 ** 110) and g2ok
                if pf and fin and nl <= K:
                    srow = stp[row]
                    oo = ob + 8 * t
                    osc = osb + t
                    # two units per iteration (0, 1 then 2, 3): one select per register pair, and
                    # the two units' tables are independent (ILP)
                    k = np.uint32(0)
                    n32 = np.uint32(nl)
                    while k < n32:
                        p0 = k == np.uint32(0)
                        wa = w0 if p0 else w2
                        wb_ = w1 if p0 else w3
                        swa = sw0 if p0 else sw2
                        swb = sw1 if p0 else sw3
                        gma = gm0 if p0 else gm2
                        gmb = gm1 if p0 else gm3
                        sba, ra = _rq_out_scale_fast(gma, g2)
                        sbb, rb = _rq_out_scale_fast(gmb, g2)
                        _stf(out_scales, osc, sba)
                        _rq_emit_4bit_fast(F, wa, swa, srow, ra, o32, oo)
                        if np.uint32(k + np.uint32(1)) < n32:
                            _stf(out_scales, osc + T, sbb)
                            _rq_emit_4bit_fast(F, wb_, swb, srow, rb, o32, oo + 8 * T)
                        osc += 2 * T
                        oo += 16 * T
                        k = np.uint32(k + np.uint32(2))
                    nl = 0  # done: the general loop below runs no unit
            # a loop, not unrolled: one copy of the encoder keeps the hot loop in the instruction
            # cache (unrolled over 4 units it was ~3000 instructions and stalled on fetch; ncu).
            # Units past the kept ones (large pages) are read again.
            if K == 1:  # one kept unit: the next unit is read at the end of the iteration, into the
                # same registers (selecting the kept unit inside the loop cost 32 register moves a page)
                w, sw, s, gm = w0, sw0, s0, gm0
                for k in range(nl):
                    u = t + T * k
                    unit(w, sw, s, gm, stp, row, g, g2, g2ok, o32, out_scales, ob, osb, u)
                    if k + 1 < nl:
                        w, sw, s = load(c32, scales, wb, sb0, r0, u + T, nu, ld)
                        gm = umax(F, w, sw, s, stp, row, g)
            else:
                for k in range(nl):
                    u = t + T * k
                    if k < K:
                        w = w0 if k == 0 else (w1 if k == 1 else (w2 if k == 2 else w3))
                        sw = sw0 if k == 0 else (sw1 if k == 1 else (sw2 if k == 2 else sw3))
                        s = s0 if k == 0 else (s1 if k == 1 else (s2 if k == 2 else s3))
                        gm = gm0 if k == 0 else (gm1 if k == 1 else (gm2 if k == 2 else gm3))
                    else:
                        w, sw, s = load(c32, scales, wb, sb0, r0, u, nu, ld)
                        gm = umax(F, w, sw, s, stp, row, g)
                    unit(w, sw, s, gm, stp, row, g, g2, g2ok, o32, out_scales, ob, osb, u)
            j += cuda.gridDim.x * nwb

    return requant


def _make_requant_bf16():
    """Requantize-to-c4g64 kernel for bf16 pages (same contract as _make_requant's): a block of
    _BF16_WARPS warps per page, thread t owning half-units (32 values, 16 words) h = t, t + T, ...;
    the two halves of unit u are lanes 2u, 2u + 1 of a warp, which combine their maxima by one
    shuffle. A whole unit is 32 registers: with one a thread the kernel could not also hold the
    next page's, and with 4 blocks of 4 warps an SM it waited on its loads (ncu: long scoreboard,
    ALU 31%). Half a unit leaves room for the block's next page, loaded while this one is reduced
    and encoded. Pass 1: the half maxima, the unit maxima, the page amax through shared memory
    (double-buffered by page parity: one barrier a page); pass 2 encodes 8 values per output word
    (_bf16_enc8). Half-units past a thread's first (pages of more than 2 T units) are read in
    both passes; every thread runs the same iterations so that the shuffles are warp-uniform."""
    T = 32 * _BF16_WARPS
    F = BF16

    @cuda_kernel(max_registers=_BF16_REGS)
    def requant(codes, scales, pages, gsrc, out_codes, out_scales, out_g):
        P = codes.shape[1]
        D = out_codes.shape[2] * 2
        t = cuda.threadIdx.x
        lane = t & 31
        wid = t >> 5
        ld = _log2(D)
        c32 = codes.view(np.uint32)
        o32 = out_codes.view(np.uint32)
        red = cuda.shared.array((2, _BF16_WARPS), np.float32)  # the warps' maxima by page parity
        pd = P * D
        nu = pd >> 6  # 64-value units (output groups) of a page
        nh = 2 * nu  # half-units
        wpp = pd >> 1  # uint32 words per page
        nit = (nh + T - 1) // T  # half-units a thread walks (the same for all: uniform shuffles)
        z = np.float32(0.0)
        n = pages.shape[0]
        par = 0
        j = cuda.blockIdx.x
        wn = _rq_load_half_bf16(c32, pages, j if j < n and t < nh else -1, t, wpp)
        while j < n:
            w = wn
            jn = j + cuda.gridDim.x  # this block's next page: its first half-unit in flight from here on
            wn = _rq_load_half_bf16(c32, pages, jn if jn < n and t < nh else -1, t, wpp)
            page = np.int64(pages[j])
            g = np.float32(gsrc[j])
            gm0 = _rq_half_max_bf16(w)
            gm0 = max(gm0, cuda.shfl_xor_sync(_FULL, gm0, 1))
            amax = gm0 if gm0 <= F32_MAX else _rq_amax_slow(F, codes, scales, page, t >> 1, ld, g)
            for k in range(1, nit):
                h = t + T * k
                wk = _rq_load_half_bf16(c32, pages, j if h < nh else -1, h, wpp)
                gm = _rq_half_max_bf16(wk)
                gm = max(gm, cuda.shfl_xor_sync(_FULL, gm, 1))
                if not (gm <= F32_MAX):
                    gm = _rq_amax_slow(F, codes, scales, page, h >> 1, ld, g)
                amax = max(amax, gm)
            for sh in (16, 8, 4, 2, 1):
                amax = max(amax, cuda.shfl_xor_sync(_FULL, amax, sh))
            if lane == 0:
                red[par, wid] = amax
            cuda.syncthreads()
            amax = red[par, lane] if lane < _BF16_WARPS else z
            for sh in (16, 8, 4, 2, 1):
                amax = max(amax, cuda.shfl_xor_sync(_FULL, amax, sh))
            par ^= 1
            g2 = global_scale_for(amax)
            if t == 0:
                out_g[j] = g2
            ob = np.int64(j) * (pd >> 3)  # output uint32 words: 4 a half-unit
            osb = np.int64(j) * nu  # output scale bytes (one per unit)
            g2ok = g2 >= np.float32(2.0 ** -100) and g2 <= np.float32(2.0 ** 100)
            # pass 2, a loop (one copy of the encoder); half-units past the first are read again
            gm = gm0
            for k in range(nit):
                h = t + T * k
                if k > 0:
                    w = _rq_load_half_bf16(c32, pages, j if h < nh else -1, h, wpp)
                    gm = _rq_half_max_bf16(w)
                    gm = max(gm, cuda.shfl_xor_sync(_FULL, gm, 1))
                if h < nh:
                    sb, r = _rq_unit_scale(gm, g2, g2ok)
                    if (h & 1) == 0:
                        _stf(out_scales, osb + (h >> 1), sb)
                    if sb == E4M3_NAN:  # a poisoned group: zero codes
                        _stf4(o32, ob + 4 * h, (0, 0, 0, 0))
                    else:
                        _rq_emit_half_bf16(w, r, o32, ob + 4 * h)
            j += cuda.gridDim.x

    return requant


requant_c4g64_cuda = {f: _make_requant_bf16() if f == BF16 else _make_requant(f) for f in FORMAT_IDS.values()}


def launch_requant_c4g64(fmt_id, codes, scales, pages, gsrc, out_codes, out_scales, out_g, stream=0):
    """Requantize pages[j] of the pool (codes, scales; its source global gsrc[j]) into out_*[j]
    (c4g64 codes [n, P, D/2], scale bytes [n, P, D/64], global scales [n]). Device or host arrays."""
    _check_head_dim(out_codes.shape[2] * 2)
    _check_vec(codes, out_codes)
    _check_pages(codes, scales, out_codes, out_scales)
    if pages.shape[0] and codes.shape[1]:
        k = requant_c4g64_cuda[int(fmt_id)]
        if int(fmt_id) == BF16:  # a block per page
            k[_grid(k, pages.shape[0] * _BF16_WARPS, 32 * _BF16_WARPS), 32 * _BF16_WARPS, stream](
                codes, scales, pages, gsrc, out_codes, out_scales, out_g)
        else:  # a warp per page
            k[_grid(k, pages.shape[0]), 32 * _WARPS, stream](codes, scales, pages, gsrc, out_codes, out_scales, out_g)


PTX_SIGNATURES = [(requant_c4g64_cuda[f], f"void({_CODE_T[f]}[:,:,::1], {_SCALE_T[f]}[:,:,::1], int32[::1], "
                   "float32[::1], uint8[:,:,::1], uint8[:,:,::1], float32[::1])") for f in FORMAT_IDS.values()]
