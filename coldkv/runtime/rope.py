"""Rotary position embeddings: default, llama3 and yarn frequencies (as transformers 5 computes them).

Frequencies and angles are computed in float64 and rounded once to float32, so positions in the
hundreds of thousands keep their phase (float32 `pos * inv_freq` loses ~1e-2 rad at 360k).
"""
from __future__ import annotations

import math

import numpy as np

from coldkv.runtime.config import RopeArgs


def rope_frequencies(rope: RopeArgs, head_dim: int) -> tuple[np.ndarray, float]:
    """-> (inv_freq [head_dim // 2] float64, attention_factor applied to cos and sin)."""
    dim = head_dim
    base = rope.theta
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if rope.rope_type == "default":
        return inv_freq, 1.0
    if rope.rope_type == "llama3":
        old_ctx = rope.original_max_position_embeddings
        low_wavelen = old_ctx / rope.low_freq_factor
        high_wavelen = old_ctx / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled), 1.0
    # yarn
    factor = rope.factor

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = get_mscale(factor, rope.mscale) / get_mscale(factor, rope.mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)

    def correction_dim(rotations: float) -> float:
        ctx = rope.original_max_position_embeddings
        return dim * math.log(ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a division by zero, as transformers does
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1: keep the original frequency, 0: interpolate by `factor`
    inv_freq = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    return inv_freq, float(attention_factor)


class Rope:
    """Applies RoPE in the non-interleaved (rotate_half) layout HF checkpoints use."""

    def __init__(self, rope: RopeArgs, head_dim: int):
        self.inv_freq, self.attention_factor = rope_frequencies(rope, head_dim)  # [D/2] f64, float

    def cos_sin(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """positions [T] int -> cos, sin [T, D/2] float32 (attention_factor folded in)."""
        angles = positions.astype(np.float64)[:, None] * self.inv_freq[None, :]
        a = self.attention_factor
        return (np.cos(angles) * a).astype(np.float32), (np.sin(angles) * a).astype(np.float32)

    @staticmethod
    def apply(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """x [T, H, D] float32, cos/sin [T, D/2] -> rotated x [T, H, D] (new array)."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
