"""Decode-time GEMVs (one token) fused with the kernel that feeds each one, a numpy reference beside.

    y[N] = a[K] . w[N, K]^T, fp32 sums; w the checkpoint's 16-bit nn.Linear weight (bf16, or fp16)

A decode step of the CUDA backend is ~10 kernels a layer, most of them a few microseconds of launch
and latency (the bundled model at 32k: 84 kernels, 0.34 ms of GPU time a token, H100, 033efe9). The
prologue here computes the GEMV's 16-bit input itself, so the kernel before it goes away:

    NORM    a = 16(x / sqrt(mean(x^2) + eps) * w_norm)   x [K] float32 (the residual stream):
                                                          rms_norm + the QKV or gate|up GEMM
    SWIGLU  a = 16(silu(g) * u)                          gu [2K] 16-bit (the gate|up output):
                                                          swiglu + the down GEMM
    NONE    a = the 16-bit input [K]                     the o_proj GEMM

and the epilogue writes y as 16-bit bits (OUT16: the QKV / gate|up outputs), adds it to a float32 y
(ACC: o_proj and down accumulate into the residual), or stores it. a is the same 16-bit vector the
unfused kernels write (the same formulas; NORM's sum of squares is summed in another order, so a
value at a rounding boundary may land one 16-bit step away).

Layout: a block of WARPS warps stages a in shared memory as 16-bit pairs (K <= MAX_K), then each
warp computes ROWS consecutive outputs: lane j reads 32-bit words j, j + 32, .. of each row (a warp
load is 128 contiguous bytes), UNROLL words of every row in flight before the first product, and
the row sums meet by shuffles. Bytes moved: N K 2 (weights) + the input; a decode GEMV of a large
model is bound by the weights' DRAM reads, the bundled model's (0.8 MB) by latency.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from coldkv.numba_kernels.fp import bf16_dec, bf16_enc, f16_dec, f16_enc
from coldkv.numba_kernels.jit_cache import cuda_kernel
from coldkv.numba_kernels.layers import MAX_ROW, _warp_sum, ref_decode16, ref_encode16, rms_norm_ref, swiglu_ref

NONE, NORM, SWIGLU = 0, 1, 2  # prologues
STORE, OUT16, ACC = 0, 1, 2  # epilogues
WARPS = 4
ROWS = 4  # outputs a warp
UNROLL = 4  # 32-bit words of each row a lane loads before it multiplies
MAX_K = MAX_ROW  # a as 16-bit pairs: 32 KB of static shared memory; every hidden size the backend takes


# ==================================================================================== reference
def gemv_input16(src, *, prologue: int, norm_w=None, eps: float = 1e-6, f16: bool = False) -> np.ndarray:
    """The 16-bit bits [K] of the GEMV's input a: the prologue of the module docstring on src."""
    if prologue == NORM:
        return rms_norm_ref(np.asarray(src, np.float32)[None], np.asarray(norm_w, np.float32), eps, f16)[0]
    if prologue == SWIGLU:
        return swiglu_ref(np.asarray(src, np.uint16)[None], f16)[0]
    return np.asarray(src, np.uint16)


def gemv_ref(src, w16, *, prologue: int, epilogue: int, norm_w=None, eps: float = 1e-6, y=None,
             f16: bool = False) -> np.ndarray:
    """The spec. src: x [K] float32 (NORM), gu [2K] 16-bit bits (SWIGLU) or a [K] 16-bit bits (NONE);
    w16 [N, K] 16-bit bits. -> y [N]: 16-bit bits (OUT16), y + a.w (ACC, y given) or a.w float32."""
    a = ref_decode16(gemv_input16(src, prologue=prologue, norm_w=norm_w, eps=eps, f16=f16), f16)
    out = ref_decode16(w16, f16).astype(np.float64) @ a.astype(np.float64)
    if epilogue == OUT16:
        return ref_encode16(out.astype(np.float32), f16)
    if epilogue == ACC:
        return (np.asarray(y, np.float64) + out).astype(np.float32)
    return out.astype(np.float32)


def gemv_bound(w, a, ref, *, prologue: int, epilogue: int, f16: bool = False) -> np.ndarray:
    """[N] what a kernel's y may differ from the exact `ref` = w . a (+ y) by: w [N, K] and a [K]
    decoded to float64. float32 sums in another order; with NORM a few inputs one 16-bit step
    away (the sum of squares in another order); with OUT16 half a step of the output's rounding."""
    prods = np.abs(w * a)
    step = 2.0**-10 if f16 else 2.0**-7  # one 16-bit step, relative
    bound = 2 * w.shape[1] * 2.0**-24 * prods.sum(1)
    if prologue == NORM:
        bound += 4 * step * prods.max(1)
    if epilogue == OUT16:
        bound += 0.5 * step * np.abs(ref) * (1 + 1e-6)
    return bound


# ==================================================================================== kernel
@functools.lru_cache(maxsize=None)
def gemv_kernel(prologue: int, epilogue: int, F16: bool = False):
    """y = a . w^T for one token (module docstring); w as uint32 words [N, K / 2], src as the
    prologue's input: x float32 [K] (NORM), gu uint32 words [K] (SWIGLU: K / 2 gate words, then
    K / 2 up words) or a uint32 words [K / 2] (NONE); y float32 [N] or uint16 [N] (OUT16)."""
    enc = f16_enc if F16 else bf16_enc
    dec = f16_dec if F16 else bf16_dec
    THREADS = 32 * WARPS
    AW = MAX_K // 2  # a shared array's shape must be a plain constant
    f32, u32 = np.float32, np.uint32

    @cuda.jit(device=True, inline=True)
    def lo(wd):
        return dec(np.uint16(wd & u32(0xFFFF)))

    @cuda.jit(device=True, inline=True)
    def hi(wd):
        return dec(np.uint16(wd >> u32(16)))

    @cuda.jit(device=True, inline=True)
    def act(g, u):  # layers.swiglu_kernel's formula: the same 16-bit values
        return enc(g / (f32(1.0) + math.exp(-g)) * u)

    @cuda_kernel
    def gemv(src, norm_w, eps, w, y):
        N, K2 = w.shape
        tid = cuda.threadIdx.x
        aw = cuda.shared.array(AW, np.uint32)  # a as 16-bit pairs
        if prologue == NORM:
            red = cuda.shared.array(WARPS, np.float32)
            ss = f32(0.0)
            for i in range(tid, K2, THREADS):
                x0 = src[2 * i]
                x1 = src[2 * i + 1]
                ss += x0 * x0 + x1 * x1
            ss = _warp_sum(ss)
            if tid % 32 == 0:
                red[tid // 32] = ss
            cuda.syncthreads()
            ss = f32(0.0)
            for k in range(WARPS):
                ss += red[k]
            inv = f32(1.0) / math.sqrt(ss / f32(2 * K2) + eps)
            for i in range(tid, K2, THREADS):
                e0 = enc(src[2 * i] * inv * norm_w[2 * i])
                e1 = enc(src[2 * i + 1] * inv * norm_w[2 * i + 1])
                aw[i] = u32(e0) | (u32(e1) << u32(16))
        elif prologue == SWIGLU:
            for i in range(tid, K2, THREADS):
                g = src[i]
                u = src[K2 + i]
                aw[i] = u32(act(lo(g), lo(u))) | (u32(act(hi(g), hi(u))) << u32(16))
        else:
            for i in range(tid, K2, THREADS):
                aw[i] = src[i]
        cuda.syncthreads()

        lane = tid % 32
        n0 = (cuda.blockIdx.x * WARPS + tid // 32) * ROWS
        if n0 >= N:
            return
        acc = cuda.local.array(ROWS, np.float32)
        wv = cuda.local.array((UNROLL, ROWS), np.uint32)
        for r in range(ROWS):
            acc[r] = f32(0.0)
        for i0 in range(lane, K2, 32 * UNROLL):
            for u in range(UNROLL):  # every row's words first: ROWS x UNROLL loads in flight
                i = i0 + 32 * u
                for r in range(ROWS):
                    wv[u, r] = w[min(n0 + r, N - 1), i] if i < K2 else u32(0)
            for u in range(UNROLL):
                i = i0 + 32 * u
                if i < K2:
                    a = aw[i]
                    a0 = lo(a)
                    a1 = hi(a)
                    for r in range(ROWS):  # two FFMAs (a0 w0 + a1 w1 first was FMUL, FFMA, FADD)
                        acc[r] += a0 * lo(wv[u, r])
                        acc[r] += a1 * hi(wv[u, r])
        for r in range(ROWS):
            s = _warp_sum(acc[r])
            if lane == r and n0 + r < N:
                if epilogue == OUT16:
                    y[n0 + r] = enc(s)
                elif epilogue == ACC:
                    y[n0 + r] += s
                else:
                    y[n0 + r] = s

    return gemv


def _words(a16):
    """A 16-bit [.., K] device array as uint32 words [.., K / 2] (no copy)."""
    return a16.view(np.uint32)


def launch_gemv(src, w16, y, stream, *, prologue: int, epilogue: int, norm_w=None, eps: float = 0.0,
                f16: bool = False) -> None:
    """y[N] (float32, or uint16 bits with OUT16) from one token's src (gemv_ref's forms, as device
    arrays: x float32 [K], gu / a uint16 [2K] / [K]) and w16 uint16 [N, K]; K even, <= MAX_K."""
    N, K = w16.shape
    if K % 2 or K > MAX_K:
        raise ValueError(f"gemv: K even and at most {MAX_K}, got {K}")
    if y.shape != (N,) or (y.dtype == np.uint16) != (epilogue == OUT16):
        raise ValueError(f"gemv: y [{N}], uint16 exactly with OUT16; got {y.shape} {y.dtype}")
    src = src if prologue == NORM else _words(src)
    nw = norm_w if norm_w is not None else src  # unread unless NORM
    blocks = -(-N // (WARPS * ROWS))
    gemv_kernel(prologue, epilogue, f16)[blocks, 32 * WARPS, stream](src, nw, np.float32(eps), _words(w16), y)


def _sigs():
    from numba import types as t

    f32v, u32v, u32m = t.float32[::1], t.uint32[::1], t.uint32[:, ::1]
    out = []
    for pro, src in ((NORM, f32v), (SWIGLU, u32v), (NONE, u32v)):
        for epi, y in ((OUT16, t.uint16[::1]), (ACC, f32v), (STORE, f32v)):
            nw = f32v if pro == NORM else src
            out.append((gemv_kernel(pro, epi, False), (src, nw, t.float32, u32m, y)))
    return out


PTX_SIGNATURES = _sigs()
