"""Realistic 4-bit head-pages for the rANS tests, made independently of coldkv.codecs.quantize.

Values are Gaussian, Laplace or Gaussian with a few large outlier channels (what real K looks like);
they are quantized with the NVFP4 recipe (global = 448*6/amax, E4M3 block scale, E2M1 codes)
rounded by ml_dtypes. ISO3 codes are sign + 3-bit magnitude nibbles.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from coldkv.codecs.packed import FORMATS, Packed

_E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def values(kind: str, tokens: int, head_dim: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "gaussian":
        return rng.standard_normal((tokens, head_dim)).astype(np.float32)
    if kind == "laplace":
        return rng.laplace(size=(tokens, head_dim)).astype(np.float32)
    if kind == "outlier":  # a few channels 10-30x larger, as in real K caches
        x = rng.standard_normal((tokens, head_dim)).astype(np.float32)
        ch = rng.choice(head_dim, max(1, head_dim // 32), replace=False)
        x[:, ch] *= rng.uniform(10, 30, ch.size).astype(np.float32)
        return x
    raise ValueError(kind)


def _e2m1_code(v: np.ndarray) -> np.ndarray:
    """Nearest-even E2M1 code (nibble) of v (already scaled into [-6, 6])."""
    q = np.clip(v, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    mag = np.abs(q)
    code = np.searchsorted(_E2M1_VALUES[:8], mag).astype(np.uint8)
    return code | (np.signbit(q).astype(np.uint8) << 3)


def pack_nibbles(nib: np.ndarray) -> np.ndarray:
    return (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)


def page(fmt: str, x: np.ndarray) -> Packed:
    tokens, head_dim = x.shape
    group = FORMATS[fmt][3]
    amax = float(np.abs(x).max()) or 1.0
    gscale = np.float32(448.0 * 6.0 / amax)
    blocks = x.reshape(tokens, head_dim // group, group)
    bmax = np.abs(blocks).max(axis=2)
    sc = np.clip(gscale * bmax / 6.0, 0, 448).astype(ml_dtypes.float8_e4m3fn)
    scale = sc.astype(np.float32)
    scale[scale == 0] = 1.0
    y = blocks * gscale / scale[:, :, None]
    if fmt == "iso3":
        mag = np.clip(np.rint(np.abs(y) / 6.0 * 7.0), 0, 7).astype(np.uint8)
        nib = mag | (np.signbit(y).astype(np.uint8) << 3)
    else:
        nib = _e2m1_code(y)
    codes = pack_nibbles(nib.reshape(tokens, head_dim))
    return Packed(fmt, codes, sc.view(np.uint8).reshape(tokens, head_dim // group), float(gscale), head_dim)


def random_page(fmt: str, kind: str, tokens: int, head_dim: int, seed: int) -> Packed:
    rng = np.random.default_rng(seed)
    return page(fmt, values(kind, tokens, head_dim, rng))
