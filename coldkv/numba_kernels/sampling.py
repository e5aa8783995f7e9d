"""Next-token sampling on the GPU: greedy, temperature, top-k, top-p, in one block of threads.

Why: with a real vocabulary (128k-152k ids) the host spends ~0.1 ms (greedy: copy + argmax) to
~10 ms (top-p: a full argsort) per token, up to 10x a decode step; here 4 bytes come back.

Rules (`sample_ref` is the spec; runtime/sampling.Sampler applies the same ones on the host):
  temperature 0   argmax, the first index among equal maxima;
  z = float32(logit) / float32(temperature);
  top_k > 0       keep z >= the k-th largest z (ties with it kept);
  top_p < 1       keep the smallest set of the largest probabilities whose sum reaches top_p,
                  and every value tied with the last one kept (the host keeps one by index);
  the draw        Gumbel-max: argmax over the kept i of z_i + G_i, G_i = -log(-log u_i), u_i a
                  hash of (seed, step, i): an exact draw from the renormalised kept distribution,
                  reproducible per (seed, step), not the same draws as the host's numpy Generator.
Thresholds are found by bisection on an order-preserving integer key of z (32 rounds of block
reductions), so nothing is sorted. `state` = [seed, step] on the device; each call advances step,
so a captured decode graph draws a fresh sample each replay without the host writing anything.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda
from numba.extending import register_jitable

from coldkv.numba_kernels.fp import f32_bits
from coldkv.numba_kernels.jit_cache import cuda_kernel

MAX_THREADS = 1024
_M32 = 0xFFFFFFFF


@register_jitable
def order_key(v):
    """float32 -> int64 in [0, 2^32) with the same order (IEEE bits, negatives flipped)."""
    b = f32_bits(v)
    return b ^ _M32 if b >> 31 else b | 0x80000000


@register_jitable
def _scaled(v, temp):
    """logit / temperature in float32; NaN counts as -inf."""
    z = v / temp
    return z if z == z else np.float32(-np.inf)


@register_jitable
def _mix(x):
    # 32-bit avalanche (lowbias32-style); both constants < 2^31, so every product fits in int64
    x &= _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x6C8E9CF5) & _M32
    return x ^ (x >> 16)


@register_jitable
def gumbel(seed, step, i):
    """G = -log(-log u), u in (0, 1) from 24 hashed bits of (seed, step, i); float64."""
    h = _mix(_mix(_mix(i) ^ (step & _M32)) ^ (seed & _M32) ^ ((step >> 32) & _M32))
    u = ((h >> 8) + 0.5) * (1.0 / 16777216.0)
    return -math.log(-math.log(u))


# ------------------------------------------------------------------------------ reference
def _nan_to_neg_inf(x) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return np.where(np.isnan(x), np.float32(-np.inf), x)


def kept_ref(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """-> (z float32 [V], kept bool [V]) for temperature > 0, as sample_kernel decides them."""
    z = _nan_to_neg_inf(logits) / np.float32(temperature)
    keys = np.array([order_key(v) for v in z], np.int64)
    keep = np.ones(z.shape, bool)
    if 0 < top_k < z.size:
        keep &= keys >= np.sort(keys)[-top_k]
    if top_p < 1:
        e = np.where(keep, np.exp(z.astype(np.float64) - float(z.max())), 0.0)
        order = np.argsort(-keys, kind="stable")
        cum = np.cumsum(e[order])
        last = order[min(int(np.searchsorted(cum, top_p * e.sum())), z.size - 1)]
        keep &= keys >= keys[last]
    return z, keep


def sample_ref(logits: np.ndarray, temperature: float, top_k: int, top_p: float, seed: int, step: int) -> int:
    """The spec of sample_kernel (numpy, float64 where the kernel is). NaN logits count as -inf."""
    if temperature == 0:
        return int(np.argmax(_nan_to_neg_inf(logits)))
    z, keep = kept_ref(logits, temperature, top_k, top_p)
    score = np.array([z[i] + gumbel(seed, step, i) if keep[i] else -np.inf for i in range(z.size)])
    return int(np.argmax(score))


# ------------------------------------------------------------------------------ CUDA
@cuda.jit(device=True)
def _sum(v, buf):
    """Block-wide sum of one float64 per thread (every thread gets it)."""
    t, n = cuda.threadIdx.x, cuda.blockDim.x
    buf[t] = v
    cuda.syncthreads()
    s = n // 2
    while s > 0:  # blockDim is a power of two
        if t < s:
            buf[t] += buf[t + s]
        cuda.syncthreads()
        s //= 2
    r = buf[0]
    cuda.syncthreads()
    return r


@cuda.jit(device=True)
def _max(v, buf):
    """Block-wide max of one float64 per thread (every thread gets it)."""
    t, n = cuda.threadIdx.x, cuda.blockDim.x
    buf[t] = v
    cuda.syncthreads()
    s = n // 2
    while s > 0:
        if t < s:
            buf[t] = max(buf[t], buf[t + s])
        cuda.syncthreads()
        s //= 2
    r = buf[0]
    cuda.syncthreads()
    return r


@cuda.jit(device=True)
def _argmax(v, i, vbuf, ibuf):
    """Block-wide (max v, smallest i among equal v) -> i (every thread gets it)."""
    t, n = cuda.threadIdx.x, cuda.blockDim.x
    vbuf[t] = v
    ibuf[t] = i
    cuda.syncthreads()
    s = n // 2
    while s > 0:
        if t < s:
            ov, oi = vbuf[t + s], ibuf[t + s]
            if ov > vbuf[t] or (ov == vbuf[t] and oi < ibuf[t]):
                vbuf[t] = ov
                ibuf[t] = oi
        cuda.syncthreads()
        s //= 2
    r = ibuf[0]
    cuda.syncthreads()
    return r


@cuda_kernel
def sample_kernel(logits, params, state, out):
    """logits [V] f32; params [3] f32 (temperature, top_k, top_p); state [2] int64 (seed, step),
    step advanced by one; out [1] int32 <- the token. One block, blockDim a power of two <= 1024."""
    fbuf = cuda.shared.array(MAX_THREADS, np.float64)
    ibuf = cuda.shared.array(MAX_THREADS, np.int64)
    t, n = cuda.threadIdx.x, cuda.blockDim.x
    V = logits.shape[0]
    temp, top_k, top_p = params[0], np.int64(params[1]), params[2]
    seed, step = state[0], state[1]
    if temp == 0:
        best, bi = -np.inf, V
        for i in range(t, V, n):
            v = np.float64(logits[i])
            if v != v:  # NaN counts as -inf
                v = -np.inf
            if v > best or bi == V:  # the first index among ties
                best, bi = v, i
        tok = _argmax(best, bi, fbuf, ibuf)
    else:
        kmin = np.int64(0)  # keep key >= kmin
        if 0 < top_k < V:  # largest key with count(key >= it) >= top_k: the k-th largest
            lo, hi = np.int64(0), np.int64(1) << 32
            while hi - lo > 1:
                mid = (lo + hi) // 2
                c = 0.0
                for i in range(t, V, n):
                    if order_key(_scaled(logits[i], temp)) >= mid:
                        c += 1.0
                if _sum(c, fbuf) >= top_k:
                    lo = mid
                else:
                    hi = mid
            kmin = lo
        zmax = -np.inf
        for i in range(t, V, n):
            zmax = max(zmax, np.float64(_scaled(logits[i], temp)))
        zmax = _max(zmax, fbuf)
        if top_p < 1:  # largest key whose kept tail (key >= it) holds >= top_p of the mass
            total = 0.0
            for i in range(t, V, n):
                z = _scaled(logits[i], temp)
                if order_key(z) >= kmin:
                    total += math.exp(np.float64(z) - zmax)
            total = _sum(total, fbuf)
            lo, hi = kmin, np.int64(1) << 32
            while hi - lo > 1:
                mid = (lo + hi) // 2
                m = 0.0
                for i in range(t, V, n):
                    z = _scaled(logits[i], temp)
                    if order_key(z) >= mid:
                        m += math.exp(np.float64(z) - zmax)
                if _sum(m, fbuf) >= top_p * total:
                    lo = mid
                else:
                    hi = mid
            kmin = lo
        best, bi = -np.inf, V
        for i in range(t, V, n):
            z = _scaled(logits[i], temp)
            if order_key(z) >= kmin:
                sc = np.float64(z) + gumbel(seed, step, i)
                if sc > best or bi == V:
                    best, bi = sc, i
        tok = _argmax(best, bi, fbuf, ibuf)
    if t == 0:
        out[0] = tok
        state[1] = step + 1


def launch_sample(logits, params, state, out, stream, threads: int = MAX_THREADS) -> None:
    sample_kernel[1, threads, stream](logits, params, state, out)


PTX_SIGNATURES = [(sample_kernel, "(float32[::1], float32[::1], int64[::1], int32[::1])")]
