"""GQA attention over the paged, mixed-format KV cache.

- `attention_reference`: the spec, numpy float64 over dense K/V (tests only).
- `paged_attention_cpu`: njit CPU kernel. Serves decode (T = 1) and chunked causal prefill (T > 1)
  alike: for each KV head it walks the sequence's pages once, dequantizes one K tile and one V tile
  (page_tokens x head_dim) into scratch, and updates an online softmax (flash-attention style) for
  all T x group query rows. The cache is never dequantized as a whole.

Cold-slot sentinels (table entries <= -2) are not decoded here yet: the kernel reads hot pages and
raises on any other entry in range, rather than read a wrong page.
"""
from __future__ import annotations

import numpy as np
from coldkv.numba_kernels.jit_cache import cached_njit

from coldkv.numba_kernels.quant import dequant_rows_cpu

PTX_SIGNATURES: list = []  # CUDA kernels land with the CUDA backend


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int, sm_scale: float) -> np.ndarray:
    """q [T, Hq, D], k/v [L, H, D] with L >= pos0 + T; query t sits at position pos0 + t and sees
    keys 0..pos0 + t. -> [T, Hq, D] float64."""
    T, Hq, D = q.shape
    L, H, _ = k.shape
    G = Hq // H
    out = np.empty((T, Hq, D))
    kpos = np.arange(L)
    for hq in range(Hq):
        h = hq // G
        s = (q[:, hq, :].astype(np.float64) @ k[:, h, :].astype(np.float64).T) * sm_scale  # [T, L]
        s[kpos[None, :] > (pos0 + np.arange(T))[:, None]] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, hq, :] = (p / p.sum(axis=1, keepdims=True)) @ v[:, h, :].astype(np.float64)
    return out


# reassoc lets LLVM vectorize the dot-product reductions; no 'ninf'/'nnan': the running max starts at -inf.
_FAST = {"reassoc", "contract", "nsz", "arcp"}


@cached_njit(fastmath=_FAST)
def paged_attention_cpu(q, out, pos0, sm_scale, k_fmt, k_codes, k_scales, v_fmt, v_codes, v_scales,
                        gscale, table):
    """q, out [T, Hq, D] f32 (q after RoPE); pages of the cache hold positions 0..pos0 + T - 1.
    k/v_codes [n_pages, P, code_cols], k/v_scales [n_pages, P, scale_cols], gscale [2, H] f32,
    table [2, H, max_pages] i32 (row 0 K, row 1 V)."""
    T, Hq, D = q.shape
    H = table.shape[1]
    G = Hq // H
    P = k_codes.shape[1]
    L = pos0 + T
    n_pages = (L + P - 1) // P
    R = T * G  # query rows per KV head: row t * G + g is query head h * G + g at position pos0 + t
    for h in range(H):
        qh = np.empty((R, D), np.float32)  # scaled queries of this KV head's group
        for t in range(T):
            for g in range(G):
                qh[t * G + g, :] = q[t, h * G + g, :] * np.float32(sm_scale)
        m = np.full(R, -np.inf, np.float32)  # running max of scores
        lsum = np.zeros(R, np.float32)  # running softmax denominator
        acc = np.zeros((R, D), np.float32)  # running weighted V
        kt = np.zeros((P, D), np.float32)  # one dequantized K tile
        vt = np.zeros((P, D), np.float32)  # one dequantized V tile
        pm = np.zeros((R, P), np.float32)  # scores, then unnormalized probabilities, of this tile
        for p in range(n_pages):
            base = p * P
            n = min(P, L - base)
            if table[0, h, p] < 0 or table[1, h, p] < 0:
                raise ValueError("paged_attention_cpu: a page in range is unallocated or cold")
            dequant_rows_cpu(k_fmt, k_codes, k_scales, table[0, h, p], 0, n, gscale[0, h], kt[:n])
            dequant_rows_cpu(v_fmt, v_codes, v_scales, table[1, h, p], 0, n, gscale[1, h], vt[:n])
            for r in range(R):
                valid = min(n, pos0 + r // G - base + 1)  # causal: keys up to the query's position
                if valid <= 0:
                    pm[r, :] = 0.0
                    continue
                mx = m[r]
                for j in range(valid):  # scores of this row against the tile's keys
                    dot = np.float32(0.0)
                    for d in range(D):
                        dot += qh[r, d] * kt[j, d]
                    pm[r, j] = dot
                    mx = max(mx, dot)
                alpha = np.exp(m[r] - mx)
                total = np.float32(0.0)
                for j in range(valid):
                    e = np.exp(pm[r, j] - mx)
                    pm[r, j] = e
                    total += e
                lsum[r] = lsum[r] * alpha + total
                m[r] = mx
                for d in range(D):
                    acc[r, d] *= alpha
                for j in range(valid):
                    e = pm[r, j]
                    for d in range(D):
                        acc[r, d] += e * vt[j, d]
        for t in range(T):
            for g in range(G):
                r = t * G + g
                out[t, h * G + g, :] = acc[r, :] / lsum[r]
