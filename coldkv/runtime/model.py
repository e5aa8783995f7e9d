"""The decoder forward pass on the CPU: numpy float32, BLAS GEMMs, njit paged attention.

One forward call processes a chunk of T tokens at the cache's next positions (T = 1 is a decode
step): embed -> per layer [RMSNorm, fused QKV GEMM (+bias), q/k RMSNorm (Qwen3), RoPE, write K/V to
the paged cache, paged attention, o_proj, residual, RMSNorm, fused gate/up GEMM, SwiGLU, down,
residual] -> final norm -> lm_head.
"""
from __future__ import annotations

import numpy as np

from coldkv.runtime.config import ModelArgs
from coldkv.runtime.kv_cache import PagedKVCache
from coldkv.runtime.loader import LayerWeights, Weights
from coldkv.runtime.rope import Rope


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x [..., n] float32 -> x / rms(x) * weight (float32 throughout, as transformers computes it)."""
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    return x * (1.0 / np.sqrt(var + np.float32(eps))) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class Transformer:
    def __init__(self, args: ModelArgs, weights: Weights):
        self.args, self.w = args, weights
        self.rope = Rope(args.rope, args.head_dim)
        self.sm_scale = float(args.head_dim) ** -0.5

    def forward(self, tokens: np.ndarray, cache: PagedKVCache, all_logits: bool = False) -> np.ndarray:
        """tokens [T] int -> logits [T, vocab] if all_logits else [vocab] (last position), float32.
        Appends the chunk's K/V to `cache`."""
        tokens = np.asarray(tokens, np.int64)
        T = tokens.shape[0]
        pos0 = cache.extend(T)
        cos, sin = self.rope.cos_sin(np.arange(pos0, pos0 + T))  # [T, head_dim / 2]
        x = self.w.embed[tokens]  # [T, dim] (a copy: the residual stream)
        for i, lw in enumerate(self.w.layers):
            x += self._attention(i, lw, rms_norm(x, lw.attn_norm, self.args.rms_norm_eps), cache, pos0, cos, sin)
            x += self._mlp(lw, rms_norm(x, lw.mlp_norm, self.args.rms_norm_eps))
        x = rms_norm(x if all_logits else x[-1:], self.w.norm, self.args.rms_norm_eps)
        logits = x @ self.w.lm_head.T  # [T or 1, vocab]
        return logits if all_logits else logits[0]

    def _attention(self, i: int, lw: LayerWeights, h: np.ndarray, cache: PagedKVCache, pos0: int,
                   cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        a = self.args
        T, hd, nq, nkv = h.shape[0], a.head_dim, a.num_attention_heads, a.num_key_value_heads
        qkv = h @ lw.wqkv.T  # [T, (nq + 2 nkv) * hd]
        if lw.bqkv is not None:
            qkv += lw.bqkv
        q = qkv[:, : nq * hd].reshape(T, nq, hd)
        k = qkv[:, nq * hd: (nq + nkv) * hd].reshape(T, nkv, hd)
        v = qkv[:, (nq + nkv) * hd:].reshape(T, nkv, hd)
        if lw.q_norm is not None:
            q = rms_norm(q, lw.q_norm, a.rms_norm_eps)
            k = rms_norm(k, lw.k_norm, a.rms_norm_eps)
        q, k = Rope.apply(q, cos, sin), Rope.apply(k, cos, sin)  # [T, nq, hd], [T, nkv, hd]
        cache.write(i, pos0, k, v)
        o = cache.attend(i, q, pos0, self.sm_scale)  # [T, nq, hd]
        out = o.reshape(T, nq * hd) @ lw.wo.T  # [T, dim]
        if lw.bo is not None:
            out += lw.bo
        return out

    def _mlp(self, lw: LayerWeights, h: np.ndarray) -> np.ndarray:
        gu = h @ lw.w_gate_up.T  # [T, 2 * hidden]
        n = gu.shape[1] // 2
        return (silu(gu[:, :n]) * gu[:, n:]) @ lw.w_down.T  # [T, dim]
