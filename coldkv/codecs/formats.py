"""KV formats, public API: E2M1/E4M3 scalars and quantize / dequantize / requantize of blocks.

Numpy only (no compilation): these call the reference in coldkv.numba_kernels.quant, which is
the spec the CPU and CUDA kernels match bit for bit. docs/formats.md describes the layouts.

Input rules (all raise ValueError, never guess):
  - values must be a real floating array (float16/32/64; float64 is rounded to float32 first,
    the formats are defined on float32);
  - NaN is refused everywhere; +-inf is refused by quantize() and saturates (to +-6 / +-448)
    in e2m1_encode / e4m3_encode, which clamp before rounding;
  - quantize() takes x [tokens, head_dim] with head_dim a multiple of the format's group.
"""
from __future__ import annotations

import numpy as np

from coldkv.codecs.packed import FORMATS, Packed, check_format
from coldkv.numba_kernels import quant as Q

GROUP = {"bf16": 1, "int8": 1, "nvfp4": 16, "iso3": 16, "c4g64": 64}  # head_dim must be a multiple


def _floats(x, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise ValueError(f"{what}: expected a floating-point array, got dtype {a.dtype}")
    a = a.astype(np.float32, copy=False)
    if np.isnan(a).any():
        raise ValueError(f"{what}: input contains NaN (first at index {np.argwhere(np.isnan(a))[0].tolist()})")
    return a


def _codes(c, what: str, hi: int) -> np.ndarray:
    a = np.asarray(c)
    if a.dtype.kind not in "ui":
        raise ValueError(f"{what}: expected integer codes, got dtype {a.dtype}")
    if a.size and (a.min() < 0 or a.max() > hi):
        raise ValueError(f"{what}: codes must be in 0..{hi}")
    return a.astype(np.uint8)


def e2m1_encode(x) -> np.ndarray:
    """float -> E2M1 codes (uint8 0..15, one per element; S EE M). RNE; |x| > 6 saturates."""
    return Q.ref_e2m1_encode(_floats(x, "e2m1_encode"))


def e2m1_decode(codes) -> np.ndarray:
    """E2M1 codes (0..15) -> float32."""
    return Q.ref_e2m1_decode(_codes(codes, "e2m1_decode", 15))


def e4m3_encode(x) -> np.ndarray:
    """float -> E4M3fn bytes (uint8). RNE; |x| > 448 (and inf) saturates to +-448, never NaN."""
    return Q.ref_e4m3_encode(_floats(x, "e4m3_encode"))


def e4m3_decode(b) -> np.ndarray:
    """E4M3fn bytes -> float32; 0x7F and 0xFF are NaN (the only NaNs of the format)."""
    return Q.ref_e4m3_decode(_codes(b, "e4m3_decode", 255))


def quantize(x, fmt: str, global_scale: float | None = None) -> Packed:
    """Quantize x float [tokens, head_dim] to `fmt`.

    global_scale (nvfp4, iso3, c4g64 only): the fp32 second-level scale g the runtime fixed for
    this layer and head (values are multiplied by g before the E4M3 scales are chosen). None
    derives it from x: g = global_scale_for(max|x|) = 2688 / max|x|.
    """
    check_format(fmt)
    a = _floats(x, "quantize")
    if a.ndim != 2:
        raise ValueError(f"quantize: expected x of shape [tokens, head_dim], got shape {a.shape}")
    tokens, head_dim = a.shape
    if head_dim == 0 or head_dim % GROUP[fmt] or head_dim % 2:
        raise ValueError(f"quantize: head_dim {head_dim} must be even and a multiple of "
                         f"{GROUP[fmt]} for {fmt}")
    if not np.isfinite(a).all():
        raise ValueError(f"quantize: input contains inf (first at {np.argwhere(~np.isfinite(a))[0].tolist()})")
    has_global = FORMATS[fmt][4]
    if global_scale is None:
        g = Q.global_scale_for(np.abs(a).max(initial=np.float32(0))) if has_global else np.float32(1)
    else:
        if not has_global:
            raise ValueError(f"quantize: {fmt} has no second-level scale; do not pass global_scale")
        g = np.float32(global_scale)
        if not (np.isfinite(g) and g > 0):
            raise ValueError(f"quantize: global_scale must be a finite positive float32, got {global_scale!r}")
    fid = Q.FORMAT_IDS[fmt]
    codes, scales = Q.ref_quantize(a, fid, g)
    if fid == Q.INT8:
        scales = scales[:, 0].copy()  # one fp32 per token
    return Packed(fmt, codes, scales, float(g), head_dim)


def _check_packed(p) -> None:
    if not isinstance(p, Packed):
        raise ValueError(f"expected a Packed block, got {type(p).__name__}")
    check_format(p.fmt)
    cdt, per_value, sdt, group, _ = FORMATS[p.fmt]
    want_c = (p.tokens, int(p.head_dim * per_value))
    if p.codes.dtype != cdt or p.codes.shape != want_c:
        raise ValueError(f"Packed {p.fmt}: codes must be {cdt} {want_c}, got {p.codes.dtype} {p.codes.shape}")
    if p.fmt == "int8":
        want_s = (p.tokens,)
    else:
        want_s = (p.tokens, p.head_dim // group if group > 0 else 0)
    if sdt is not None and (p.scales.dtype != sdt or p.scales.shape != want_s):
        raise ValueError(f"Packed {p.fmt}: scales must be {sdt} {want_s}, got {p.scales.dtype} {p.scales.shape}")


def dequantize(p: Packed) -> np.ndarray:
    """Packed -> float32 [tokens, head_dim]."""
    _check_packed(p)
    fid = Q.FORMAT_IDS[p.fmt]
    scales = p.scales.reshape(p.tokens, 1) if fid == Q.INT8 else p.scales
    return Q.ref_dequantize(p.codes, scales, fid, np.float32(p.global_scale), p.head_dim)


def requantize(p: Packed, fmt: str = "c4g64", global_scale: float | None = None) -> Packed:
    """Decode p and quantize it again to `fmt` (the cold path: any hot format -> c4g64).

    Without global_scale the new second-level scale comes from the block's own amax (c4g64 keeps
    one fp32 per head-page).
    """
    check_format(fmt)
    return quantize(dequantize(p), fmt, global_scale)


__all__ = ["Packed", "e2m1_encode", "e2m1_decode", "e4m3_encode", "e4m3_decode",
           "quantize", "dequantize", "requantize"]
