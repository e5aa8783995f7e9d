"""Scalar cores for E2M1, E4M3, bf16, fp16 and the 3-bit ISO3 magnitude, written once.

Every function here is plain Python decorated with `register_jitable`, so the same source runs
  - as Python (the CUDA simulator, debugging),
  - inside `numba.njit` CPU kernels,
  - inside `@cuda.jit` kernels (numba-cuda resolves register_jitable overloads too).
The numpy reference in quant.py is the spec; tests check these cores against it bit for bit.

Rules that keep CPU and GPU bit-identical:
  - all float math is float32 (explicit np.float32 constants: a float64 literal would promote);
  - only IEEE ops with a single rounding: *, /, min, max, compare (numba-cuda emits div.rn.f32);
  - never a multiply feeding an add with an inexact product: NVVM contracts a*b+c into an fma
    (one rounding instead of two). Where we round with the "add a magic constant" trick the
    operand always comes out of a min/max clamp first, which breaks the contraction.
  - float <-> bits through scalar `.view` (a free bitcast on both targets, numpy in Python).
Callers handle NaN/inf (see quant.py); the encoders below assume finite input.
"""
from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

F32_MAX = np.float32(3.4028234663852886e38)
E4M3_MAX = np.float32(448.0)
E2M1_MAX = np.float32(6.0)
E4M3_NAN = 0x7F  # E4M3fn has no inf; 0x7F/0xFF are its only NaNs
# Doubled E2M1 magnitudes {0,1,2,3,4,6,8,12} packed as nibbles: index i -> (K >> 4i) & 15.
_E2M1_TWICE = 0xC8643210


@register_jitable
def f32_bits(v):
    """float32 -> its IEEE bits as int64 (0..2^32-1)."""
    return np.int64(np.float32(v).view(np.uint32))


@register_jitable
def bits_f32(b):
    """IEEE bits (0..2^32-1) -> float32."""
    return np.uint32(b).view(np.float32)


# ---------------------------------------------------------------------------------- E2M1 (fp4)
@register_jitable
def e2m1_enc(v):
    """float32 -> E2M1 code 0..15 (S EE M), round to nearest even, saturate at 6.

    The midpoints between the magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} are exact in float32; at a
    midpoint the even code wins, hence '>' where the lower code is even and '>=' where it is odd.
    The sign bit is kept (-0.0 and tiny negatives give 0x8, as ml_dtypes does).
    """
    a = abs(np.float32(v))
    m = ((1 if a > np.float32(0.25) else 0) + (1 if a >= np.float32(0.75) else 0)
         + (1 if a > np.float32(1.25) else 0) + (1 if a >= np.float32(1.75) else 0)
         + (1 if a > np.float32(2.5) else 0) + (1 if a >= np.float32(3.5) else 0)
         + (1 if a > np.float32(5.0) else 0))
    return ((f32_bits(v) >> 31) << 3) | m


@register_jitable
def e2m1_dec(c):
    """E2M1 code (low 4 bits used) -> float32."""
    twice = (_E2M1_TWICE >> ((c & 7) * 4)) & 15
    v = np.float32(twice) * np.float32(0.5)
    return -v if (c & 8) else v


# ---------------------------------------------------------------------------------- E4M3fn (fp8)
@register_jitable
def e4m3_enc(v):
    """float32 -> E4M3fn byte, round to nearest even, saturating at +-448 (never NaN).

    Normal range (|v| >= 2^-6): E4M3 keeps 3 of fp32's 23 mantissa bits, so round the fp32 bits
    at bit 20 (RNE: add 0x7FFFF plus the lowest kept bit); a carry rolls into the exponent, which
    is exactly right. Rebias 127 -> 7: subtract 120 << 3 from (bits >> 20).
    Subnormals (|v| < 2^-6, step 2^-9): shift the 24-bit significand right with RNE.
    """
    sign = (f32_bits(v) >> 31) << 7
    a = min(abs(np.float32(v)), E4M3_MAX)
    b = f32_bits(a)
    exp = b >> 23
    if exp >= 121:  # 2^-6 has biased exponent 121
        code = ((b + 0x7FFFF + ((b >> 20) & 1)) >> 20) - 960
    else:
        shift = 141 - exp  # value = sig * 2^(exp-150); in units of 2^-9: sig >> (141 - exp)
        if shift > 24 or exp == 0:
            code = 0  # below half of 2^-9 (fp32 denormals included)
        else:
            sig = (b & 0x7FFFFF) | 0x800000
            code = (sig + (1 << (shift - 1)) - 1 + ((sig >> shift) & 1)) >> shift
    return sign | code


@register_jitable
def e4m3_dec(c):
    """E4M3fn byte -> float32 (0x7F / 0xFF -> NaN)."""
    e = (c >> 3) & 15
    m = c & 7
    if e == 0:
        v = np.float32(m) * np.float32(0.001953125)  # subnormal: m * 2^-9, exact
    elif e == 15 and m == 7:
        v = bits_f32(0x7FC00000)
    else:
        v = bits_f32(((e + 120) << 23) | (m << 20))
    return -v if (c & 0x80) else v


# ---------------------------------------------------------------------------------- bf16
@register_jitable
def bf16_enc(v):
    """float32 -> bf16 bits (0..65535), round to nearest even; NaN stays a (quiet) NaN."""
    b = f32_bits(v)
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return (b >> 16) | 0x40
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16


@register_jitable
def bf16_dec(h):
    """bf16 bits -> float32 (exact)."""
    return bits_f32((np.int64(h) & 0xFFFF) << 16)


# ---------------------------------------------------------------------------------- fp16
@register_jitable
def f16_enc(v):
    """float32 -> IEEE half bits (0..65535), round to nearest even, overflow to inf, subnormals
    kept; NaN -> the quiet NaN 0x7E00 with its sign (what numpy's astype(float16) gives a float32
    quiet NaN without payload). For the GEMM inputs of fp16 checkpoints (layers.py)."""
    b = f32_bits(v)
    s = (b >> 16) & 0x8000
    a = b & 0x7FFFFFFF
    if a > 0x7F800000:
        return s | 0x7E00
    if a >= 0x477FF000:  # >= 65520 (the tie between 65504 and 2^16 goes up): inf
        return s | 0x7C00
    if a >= 0x38800000:  # a normal half: rebias the exponent (127 -> 15), round off 13 bits
        return s | ((a - 0x38000000 + 0xFFF + ((a >> 13) & 1)) >> 13)
    # a subnormal half (or zero): units of 2^-24, exact scaling, rounded by the magic add; 1024 is
    # the smallest normal's bits, so a carry out of the subnormals is right as it is
    return s | rne_small(bits_f32(a) * np.float32(16777216.0))


@register_jitable
def f16_dec(h):
    """IEEE half bits -> float32 (exact)."""
    h = np.int64(h) & 0xFFFF
    s = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        return bits_f32(s | f32_bits(np.float32(m) * np.float32(5.960464477539063e-08)))  # m 2^-24
    if e == 31:
        return bits_f32(s | 0x7F800000 | (m << 13))
    return bits_f32(s | ((e + 112) << 23) | (m << 13))


# ---------------------------------------------------------------------------------- ISO3, int8
@register_jitable
def rne_small(u):
    """Round a float32 in [0, 2^22) to the nearest integer, ties to even (IEEE add does it)."""
    return f32_bits(np.float32(u) + np.float32(8388608.0)) - 0x4B000000


@register_jitable
def iso3_enc(v, r):
    """value * r -> ISO3 code: sign bit 3, magnitude m = RNE(|v| * r) clamped to 7 (bits 0-2)."""
    u = min(abs(np.float32(v)) * np.float32(r), np.float32(7.0))
    return ((f32_bits(v) >> 31) << 3) | rne_small(u)


@register_jitable
def iso3_dec(c):
    """ISO3 code -> signed magnitude as float32 (the caller multiplies by the step s/g)."""
    v = np.float32(c & 7)
    return -v if (c & 8) else v


@register_jitable
def int8_enc(v, inv):
    """v * inv -> int8 code, RNE, clamped to [-127, 127] (symmetric: -128 is never used)."""
    q = max(min(np.float32(v) * np.float32(inv), np.float32(127.0)), np.float32(-127.0))
    # 1.5 * 2^23 + q stays in [2^23, 2^24) where the fp32 step is 1: the add rounds q (RNE).
    return f32_bits(q + np.float32(12582912.0)) - 0x4B400000


@register_jitable
def global_scale_for(amax):
    """Second-level (fp32) scale for a plane whose largest |value| is amax: g = 448 * 6 / amax.

    Values are multiplied by g before the E4M3 block scale is chosen, so a block holding amax
    gets the largest E4M3 scale (448) and E2M1's 6. Magnitudes above amax saturate (to amax
    for nvfp4/c4g64; iso3 uses at most 6/7 of the E4M3 range and saturates at 7/6 amax).
    amax below 1e-35 (g would overflow), or non-finite, gives g = 1 (such a plane decodes as 0).
    """
    a = np.float32(amax)
    if a >= np.float32(1e-35) and a <= F32_MAX:
        return np.float32(2688.0) / a
    return np.float32(1.0)
