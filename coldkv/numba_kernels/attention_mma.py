"""Tensor-core decode/prefill attention over the paged, mixed-format KV cache (GPU only).

Same contract, grid, split plan, workspace and reduction as attention_cuda (one warp = one split
of a (query token, kv head); the G <= 8 q heads of the kv group share every page read), but both
products run on `mma.sync.aligned.m16n8k16` (inline PTX; Numba has no WMMA API) with fp32
accumulation, and codes are decoded straight from registers into 16-bit operand pairs:

  K phase, per 8-token tile:  S[g, tok] = sum_d q[g, d] K[tok, d]      A = q (rows g, 8 of 16 used,
      held in registers for the whole kernel), B = K^T (n = tok: lane (gid, tig) loads the row of
      token gid). For the 4-bit formats every k16 step is one 16-value scale group, so the E4M3
      group scale is applied to the step's fp32 result (per token column); int8's row scale once
      per tile; bf16 needs none.
  softmax: lane (gid, tig) holds S[g = gid, tok = 2 tig, 2 tig + 1] of each tile: row max over the
      4 lanes of a row, lazy rescaling as in attention_cuda (the max moves only when it grows by
      more than 2^8), p = exp2(s - m) in fp32.
  V phase, per 16 tokens: O^T[d, g] += V^T[d, tok] P^T[tok, g]   A = V^T (rows d, k = tok), B = P^T,
      which is exactly the K phase's accumulator layout of two tiles (no shuffle, as in FA2).
      Scales vary along the reduction (tokens), so they go into B: P * (E4M3 group scale) for the
      4-bit formats (one B per 16-dim group), P * row scale for int8.

Operand decoding (exact): E2M1 nibble s|eem -> fp16 bits (s << 15) | (eem << 9) = value * 2^-14,
times 2^14 by mul.f16x2 (exact; keeps the operands normal fp16); ISO3 nibble s|mmm -> fp16
(0x6400 | mmm) - 1024 with the sign or-ed in; int8 -> fp16 (0x6400 | (b ^ 0x80)) - 1152
(byte_perm); bf16 codes are bf16 operands as stored. The global scales (1/g) are folded into the
shared E4M3 table (K) and one multiply at the end (V). Only q and p are rounded to 16 bits (fp16,
or bf16 where the other operand is bf16), as in flash attention; accumulation is fp32.

This file is the decode kernel (one query token per warp-split); the prefill kernels (query
tokens on the MMA rows) are in attention_prefill.py, the inline-PTX primitives and their
simulator emulations in mma_ptx.py.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from coldkv.numba_kernels import attention_cuda
from coldkv.numba_kernels.attention_cuda import _pos_dev, _pos_int
from coldkv.numba_kernels.mma_ptx import (  # noqa: F401 (SIMULATED, _sim_install: attention_cuda)
    SIMULATED, _E4M3_TAB, _sim_install, dec_e2m1, dec_i8, dec_iso3, e4m3x2, ldg2, ldg4, mma_bf16, mma_f16,
    mul_f16x2, pack_bf16, pack_f16, prmt)
from coldkv.numba_kernels.quant import BF16, INT8, ISO3, NVFP4

NWARPS = 4
THREADS = 32 * NWARPS
_LAZY = np.float32(8.0)
_NEG_INF = np.float32(-np.inf)
_VPW = {BF16: 2, INT8: 4, NVFP4: 8, ISO3: 8}

# ------------------------------------------------------------------------------ the kernel
def supports(kf: int, vf: int, G: int, D: int) -> bool:
    return G <= 8 and D % 64 == 0 and D <= 256 and kf in _VPW and vf in _VPW


def _build(kf: int, vf: int, G: int, D: int, devpos: bool, nt: int = 0, max_registers=None, u64: bool = False,
           exact: bool = False):
    NS = D // 16  # k16 steps of the K phase = 16-dim tiles of the V phase
    RWK, RWV = D // _VPW[kf], D // _VPW[vf]  # 32-bit code words per row
    SW = D // 64  # E4M3 scale words per row (4-bit formats)
    NT = nt or 2  # 8-token K tiles per chunk (even; registers grow with it)
    CH = 8 * NT
    NT2 = NT // 2  # 16-token V steps per chunk
    K4, V4 = kf in (NVFP4, ISO3), vf in (NVFP4, ISO3)
    KW = NS if kf == INT8 else 2 * NS  # K code words a lane holds per token
    mma_k = mma_bf16 if kf == BF16 else mma_f16
    mma_v = mma_bf16 if vf == BF16 else mma_f16
    pack_k = pack_bf16 if kf == BF16 else pack_f16
    pack_v = pack_bf16 if vf == BF16 else pack_f16
    # V scales go into the fp16 B operand as p * scale * VSC: p <= 2^8 (lazy max), E4M3 <= 448,
    # so 2^-1 keeps it under the fp16 maximum.
    VSC = 0.5
    E4TAB = _E4M3_TAB
    read_pos = _pos_dev if devpos else _pos_int
    # Global/shared indices of the loop as int64 (measured default) or uint64: uint64 drops Numba's
    # negative-index wraparound (compare + select per access): loop body -25% (nvfp4) to -48%
    # (bf16) SASS, fewer registers (ptxas 13.0: nvfp4 188 -> 150). Not yet timed on the device.
    IX = np.uint64 if u64 else np.int64
    # exact: the 4-bit scales multiplied into the 16-bit operands as the prefill kernels do
    # (E4M3 pair by cvt, one mul.f16x2 per register, exact; no shared table lookups, no per-step
    # fp32 rescale of the K result, P packed once per 16 tokens). Not yet timed on the device.
    XS = exact
    f32 = np.float32
    u32 = np.uint32
    i64 = np.int64

    @cuda.jit(device=True, inline=True)
    def load_v(v_words, v_scales, vreg, vsc, vrs, pv, P, c0, last, tig, gid):
        """V code words (and scales) of the chunk: tokens 2tig, 2tig+1, 2tig+8, 2tig+9 of each
        16-token step (clamped to the page's last valid row), the words of this lane's dims."""
        for v in range(NT2):
            for i in range(4):
                row = pv * P + min(c0 + 16 * v + 2 * tig + (i & 1) + 8 * (i >> 1), last)
                for j in range(NS):
                    if V4:
                        vreg[v, i, j] = v_words[IX(row * RWV + 2 * j + (gid >> 2))]
                    elif vf == BF16:
                        vreg[v, i, j] = v_words[IX(row * RWV + 8 * j + gid)]
                    else:
                        vreg[v, i, j] = v_words[IX(row * RWV + 4 * j + (gid >> 1))] ^ u32(0x80808080)
                if V4:
                    for w in range(SW):
                        vsc[v, i, w] = v_scales[IX(row * SW + w)]
                elif vf == INT8:
                    vrs[v, i] = v_scales[IX(row)]

    jit = cuda.jit(max_registers=max_registers) if max_registers else cuda.jit

    @jit
    def attn_mma(q, pos, qscale, P, k_words, k_scales, v_words, v_scales, gscale, table, ws_acc, ws_ml):
        # k_scales/v_scales: 4-bit formats: E4M3 bytes as flat uint32 words (SW per row);
        # int8: float32 per row; bf16: unused.
        pos0 = read_pos(pos)
        t = cuda.blockIdx.x
        blk = cuda.blockIdx.y
        h = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane >> 2
        tig = lane & 3
        split = blk * NWARPS + warp
        hq0 = h * G

        e4k = cuda.shared.array(256, np.float32)  # E4M3 value * K constants
        e4v = cuda.shared.array(256, np.float32)
        kc = f32(1.0) / gscale[0, h]
        vcs = f32(VSC)
        for i in range(tid, 256, THREADS):
            e4k[i] = E4TAB[i] * kc
            e4v[i] = E4TAB[i] * vcs
        cuda.syncthreads()

        L = pos0 + t + 1
        npages = (L + P - 1) // P
        nsplit = cuda.gridDim.y * NWARPS
        ppw = ((pos0 + cuda.gridDim.x + P - 1) // P + nsplit - 1) // nsplit
        p_begin = split * ppw
        p_end = min(p_begin + ppw, npages)

        # ---- q as the A operand (rows g = gid, rows 8..15 zero), dims in the order of the K decode
        qa0 = cuda.local.array(NS, np.uint32)
        qa1 = cuda.local.array(NS, np.uint32)
        for s in range(NS):
            if K4:  # word 2s nibbles (tig, tig+4) | word 2s+1 nibbles (tig, tig+4)
                d0 = 16 * s + tig
                d1 = d0 + 4
                d2 = d0 + 8
                d3 = d0 + 12
            else:  # bf16/int8: dims 16s + 4tig + (0, 1 | 2, 3)
                d0 = 16 * s + 4 * tig
                d1 = d0 + 1
                d2 = d0 + 2
                d3 = d0 + 3
            x0 = f32(0.0)
            x1 = f32(0.0)
            x2 = f32(0.0)
            x3 = f32(0.0)
            if gid < G:
                x0 = q[t, hq0 + gid, d0] * qscale
                x1 = q[t, hq0 + gid, d1] * qscale
                x2 = q[t, hq0 + gid, d2] * qscale
                x3 = q[t, hq0 + gid, d3] * qscale
            qa0[s] = pack_k(x0, x1)
            qa1[s] = pack_k(x2, x3)

        acc = cuda.local.array((NS, 4), np.float32)  # O^T fragments: (row d, col g 2tig | 2tig+1)
        for j in range(NS):
            for i in range(4):
                acc[j, i] = f32(0.0)
        m_run = _NEG_INF  # of row g = gid
        l_run = f32(0.0)  # this lane's share of row gid's sum
        kreg = cuda.local.array((NT, KW), np.uint32)
        ksc = cuda.local.array((NT, 2, SW), np.uint32)
        krs = cuda.local.array((NT, 2), np.float32)
        sv = cuda.local.array((NT, 2), np.float32)
        vreg = cuda.local.array((NT2, 4, NS), np.uint32)
        vsc = cuda.local.array((NT2, 4, SW), np.uint32)
        vrs = cuda.local.array((NT2, 4), np.float32)
        shk = u32(4 * tig)
        shv = u32(4 * (gid & 3))
        bsel = gid & 1
        sel_i8 = u32(bsel | ((4 + bsel) << 4) | ((2 + bsel) << 8) | ((6 + bsel) << 12))

        for p in range(p_begin, p_end):
            pk = i64(table[0, h, IX(p)])
            pv = i64(table[1, h, IX(p)])
            if pk < 0 or pv < 0:
                continue  # -1 unallocated; <= -2 cold slot (not decoded here yet)
            nval = min(P, L - p * P)
            for c0 in range(0, nval, CH):
                last = nval - 1
                # ---------------- K loads: lane holds the row of token gid of each tile (clamped)
                for u in range(NT):
                    row = pk * P + min(c0 + 8 * u + gid, last)
                    if K4:
                        for m in range(KW // 4):
                            a, b, c, d = ldg4(k_words, row * RWK + 4 * m)
                            kreg[u, 4 * m] = a
                            kreg[u, 4 * m + 1] = b
                            kreg[u, 4 * m + 2] = c
                            kreg[u, 4 * m + 3] = d
                    elif kf == BF16:
                        for s in range(NS):
                            a, b = ldg2(k_words, row * RWK + 8 * s + 2 * tig)
                            kreg[u, 2 * s] = a
                            kreg[u, 2 * s + 1] = b
                    else:
                        for s in range(NS):
                            kreg[u, s] = k_words[IX(row * RWK + 4 * s + tig)] ^ u32(0x80808080)
                    if K4 and XS:  # group scales of token gid (B's column): into B
                        for w in range(SW):
                            ksc[u, 0, w] = k_scales[IX(row * SW + w)]
                    for i in range(2):  # scales of the tokens of this lane's columns
                        rc = pk * P + min(c0 + 8 * u + 2 * tig + i, last)
                        if K4 and not XS:
                            for w in range(SW):
                                ksc[u, i, w] = k_scales[IX(rc * SW + w)]
                        elif kf == INT8:
                            krs[u, i] = k_scales[IX(rc)]
                # ---------------- K: scores of the chunk
                for u in range(NT):
                    s0 = f32(0.0)
                    s1 = f32(0.0)
                    c_0 = f32(0.0)
                    c_1 = f32(0.0)
                    for s in range(NS):
                        if K4 and XS:
                            kw = ksc[u, 0, s >> 2]
                            bsh = u32(s & 3)
                            sp = e4m3x2(kw, kw, bsh | (bsh << 4))
                            if kf == NVFP4:
                                b0 = mul_f16x2(dec_e2m1(kreg[u, 2 * s], shk), sp)
                                b1 = mul_f16x2(dec_e2m1(kreg[u, 2 * s + 1], shk), sp)
                            else:
                                b0 = mul_f16x2(dec_iso3(kreg[u, 2 * s], shk), sp)
                                b1 = mul_f16x2(dec_iso3(kreg[u, 2 * s + 1], shk), sp)
                            c_0, c_1, r2, r3 = mma_k(qa0[s], 0, qa1[s], 0, b0, b1, c_0, c_1, f32(0.0), f32(0.0))
                        elif K4:
                            if kf == NVFP4:
                                b0 = dec_e2m1(kreg[u, 2 * s], shk)
                                b1 = dec_e2m1(kreg[u, 2 * s + 1], shk)
                            else:
                                b0 = dec_iso3(kreg[u, 2 * s], shk)
                                b1 = dec_iso3(kreg[u, 2 * s + 1], shk)
                            r0, r1, r2, r3 = mma_k(qa0[s], 0, qa1[s], 0, b0, b1, f32(0.0), f32(0.0), f32(0.0), f32(0.0))
                            sh = 8 * (s & 3)
                            s0 += r0 * e4k[IX((ksc[u, 0, s >> 2] >> sh) & 0xFF)]
                            s1 += r1 * e4k[IX((ksc[u, 1, s >> 2] >> sh) & 0xFF)]
                        elif kf == BF16:
                            c_0, c_1, r2, r3 = mma_k(qa0[s], 0, qa1[s], 0, kreg[u, 2 * s], kreg[u, 2 * s + 1],
                                                     c_0, c_1, f32(0.0), f32(0.0))
                        else:
                            w = kreg[u, s]
                            c_0, c_1, r2, r3 = mma_k(qa0[s], 0, qa1[s], 0, dec_i8(w, 0x5140), dec_i8(w, 0x7362),
                                                     c_0, c_1, f32(0.0), f32(0.0))
                    if kf == BF16:
                        s0 = c_0
                        s1 = c_1
                    elif kf == INT8:
                        s0 = c_0 * krs[u, 0]
                        s1 = c_1 * krs[u, 1]
                    elif XS:
                        s0 = c_0 * kc
                        s1 = c_1 * kc
                    tok = c0 + 8 * u + 2 * tig
                    sv[u, 0] = s0 if tok < nval else _NEG_INF
                    sv[u, 1] = s1 if tok + 1 < nval else _NEG_INF
                # (ptxas schedules these after the K phase's MMAs even when the source issues them
                # before it: overlapping the load latency needs the next chunk's loads, see docs)
                load_v(v_words, v_scales, vreg, vsc, vrs, pv, P, c0, last, tig, gid)
                # ---------------- softmax (row g = gid over its 4 lanes)
                mx = _NEG_INF
                for u in range(NT):
                    mx = max(mx, max(sv[u, 0], sv[u, 1]))
                mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
                mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
                need = mx > m_run + _LAZY
                if cuda.any_sync(0xFFFFFFFF, need):  # rare: the running max moves
                    mnew = mx if need else m_run
                    alpha = math.exp2(m_run - mnew)
                    l_run *= alpha
                    m_run = mnew
                    aa = cuda.shfl_sync(0xFFFFFFFF, alpha, 8 * tig)  # alpha of row g = 2tig
                    ab = cuda.shfl_sync(0xFFFFFFFF, alpha, 8 * tig + 4)
                    for j in range(NS):
                        acc[j, 0] *= aa
                        acc[j, 1] *= ab
                        acc[j, 2] *= aa
                        acc[j, 3] *= ab
                for u in range(NT):
                    for i in range(2):
                        pr = math.exp2(sv[u, i] - m_run)
                        l_run += pr
                        sv[u, i] = pr
                # ---------------- V: O^T += V^T P^T per 16-token step
                for v in range(NT2):
                    p0 = sv[2 * v, 0]  # tokens 2tig, 2tig+1 | 2tig+8, 2tig+9 of the step
                    p1 = sv[2 * v, 1]
                    p2 = sv[2 * v + 1, 0]
                    p3 = sv[2 * v + 1, 1]
                    if vf == INT8:
                        bb0 = pack_v(p0 * vrs[v, 0], p1 * vrs[v, 1])
                        bb1 = pack_v(p2 * vrs[v, 2], p3 * vrs[v, 3])
                    else:
                        bb0 = pack_v(p0, p1)
                        bb1 = pack_v(p2, p3)
                    for j in range(NS):
                        x0 = vreg[v, 0, j]
                        x1 = vreg[v, 1, j]
                        x2 = vreg[v, 2, j]
                        x3 = vreg[v, 3, j]
                        if V4 and XS:  # scales of tokens t0 | t1 (a0, a1) and t2 | t3 (a2, a3) into A
                            w = j >> 2
                            bsh = u32(j & 3)
                            sp01 = e4m3x2(vsc[v, 0, w], vsc[v, 1, w], bsh | ((bsh + 4) << 4))
                            sp23 = e4m3x2(vsc[v, 2, w], vsc[v, 3, w], bsh | ((bsh + 4) << 4))
                            z0 = prmt(x0 >> shv, x1 >> shv, 0x5410)
                            z1 = prmt(x0 >> shv, x1 >> shv, 0x7632)
                            z2 = prmt(x2 >> shv, x3 >> shv, 0x5410)
                            z3 = prmt(x2 >> shv, x3 >> shv, 0x7632)
                            if vf == NVFP4:
                                a0 = mul_f16x2(dec_e2m1(z0, 0), sp01)
                                a1 = mul_f16x2(dec_e2m1(z1, 0), sp01)
                                a2 = mul_f16x2(dec_e2m1(z2, 0), sp23)
                                a3 = mul_f16x2(dec_e2m1(z3, 0), sp23)
                            else:
                                a0 = mul_f16x2(dec_iso3(z0, 0), sp01)
                                a1 = mul_f16x2(dec_iso3(z1, 0), sp01)
                                a2 = mul_f16x2(dec_iso3(z2, 0), sp23)
                                a3 = mul_f16x2(dec_iso3(z3, 0), sp23)
                        elif V4:
                            sh = 8 * (j & 3)
                            w = j >> 2
                            bb0 = pack_v(p0 * e4v[IX((vsc[v, 0, w] >> sh) & 0xFF)], p1 * e4v[IX((vsc[v, 1, w] >> sh) & 0xFF)])
                            bb1 = pack_v(p2 * e4v[IX((vsc[v, 2, w] >> sh) & 0xFF)], p3 * e4v[IX((vsc[v, 3, w] >> sh) & 0xFF)])
                            z0 = prmt(x0 >> shv, x1 >> shv, 0x5410)  # nibble (gid&3) of t0 | t1
                            z1 = prmt(x0 >> shv, x1 >> shv, 0x7632)  # nibble (gid&3)+4
                            z2 = prmt(x2 >> shv, x3 >> shv, 0x5410)
                            z3 = prmt(x2 >> shv, x3 >> shv, 0x7632)
                            if vf == NVFP4:
                                a0 = dec_e2m1(z0, 0)
                                a1 = dec_e2m1(z1, 0)
                                a2 = dec_e2m1(z2, 0)
                                a3 = dec_e2m1(z3, 0)
                            else:
                                a0 = dec_iso3(z0, 0)
                                a1 = dec_iso3(z1, 0)
                                a2 = dec_iso3(z2, 0)
                                a3 = dec_iso3(z3, 0)
                        elif vf == BF16:
                            a0 = prmt(x0, x1, 0x5410)
                            a1 = prmt(x0, x1, 0x7632)
                            a2 = prmt(x2, x3, 0x5410)
                            a3 = prmt(x2, x3, 0x7632)
                        else:
                            z01 = prmt(x0, x1, sel_i8)
                            z23 = prmt(x2, x3, sel_i8)
                            a0 = dec_i8(z01, 0x5140)
                            a1 = dec_i8(z01, 0x7362)
                            a2 = dec_i8(z23, 0x5140)
                            a3 = dec_i8(z23, 0x7362)
                        r0, r1, r2, r3 = mma_v(a0, a1, a2, a3, bb0, bb1, acc[j, 0], acc[j, 1], acc[j, 2], acc[j, 3])
                        acc[j, 0] = r0
                        acc[j, 1] = r1
                        acc[j, 2] = r2
                        acc[j, 3] = r3

        # ---------------- the warp's partial
        l_run += cuda.shfl_xor_sync(0xFFFFFFFF, l_run, 1)
        l_run += cuda.shfl_xor_sync(0xFFFFFFFF, l_run, 2)
        vc = f32(1.0)
        if V4 and XS:
            vc = f32(1.0) / gscale[1, h]
        elif V4:
            vc = f32(1.0 / VSC) / gscale[1, h]
        for j in range(NS):
            if V4:
                dr = 16 * j + 8 * (gid >> 2) + (gid & 3)
                dr8 = dr + 4
            elif vf == BF16:
                dr = 16 * j + 2 * gid
                dr8 = dr + 1
            else:
                dr = 16 * j + 4 * (gid >> 1) + (gid & 1)
                dr8 = dr + 2
            for i in range(2):
                g = 2 * tig + i
                if g < G:
                    ws_acc[split, t, hq0 + g, dr] = acc[j, i] * vc
                    ws_acc[split, t, hq0 + g, dr8] = acc[j, 2 + i] * vc
        if tig == 0 and gid < G:
            ws_ml[split, t, hq0 + gid, 0] = m_run
            ws_ml[split, t, hq0 + gid, 1] = l_run

    return attn_mma


_KERNELS: dict = {}


def get_kernel(kf: int, vf: int, G: int, D: int, devpos: bool = False, nt: int = 0, max_registers=None,
               u64: bool = False, exact: bool = False):
    key = (int(kf), int(vf), int(G), int(D), bool(devpos), int(nt), max_registers, bool(u64), bool(exact))
    if key not in _KERNELS:
        if not supports(kf, vf, G, D):
            raise ValueError(f"attention_mma: unsupported K={kf} V={vf} G={G} D={D}")
        _KERNELS[key] = _build(*key)
    return _KERNELS[key]


_SCALE_T = {BF16: "uint8", INT8: "float32", NVFP4: "uint32", ISO3: "uint32"}


def kernel_sig(kf, vf, devpos=False):
    return attention_cuda.kernel_sig(kf, vf, devpos, _SCALE_T)


def _ptx_signatures():
    fm = [BF16, INT8, NVFP4, ISO3]
    out = [(get_kernel(f, f, 4, 128), kernel_sig(f, f)) for f in fm]
    out += [(get_kernel(NVFP4, ISO3, 4, 128), kernel_sig(NVFP4, ISO3)),
            (get_kernel(NVFP4, NVFP4, 6, 256), kernel_sig(NVFP4, NVFP4)),
            (get_kernel(INT8, BF16, 1, 64), kernel_sig(INT8, BF16)),
            (get_kernel(NVFP4, NVFP4, 4, 128, True), kernel_sig(NVFP4, NVFP4, True)),
            (get_kernel(INT8, NVFP4, 4, 128, u64=True), kernel_sig(INT8, NVFP4)),
            (get_kernel(NVFP4, NVFP4, 4, 128, u64=True, exact=True), kernel_sig(NVFP4, NVFP4)),
            (get_kernel(ISO3, INT8, 2, 64, True, u64=True, exact=True), kernel_sig(ISO3, INT8, True)),
            (get_kernel(BF16, ISO3, 6, 256, u64=True, exact=True), kernel_sig(BF16, ISO3))]
    return out


PTX_SIGNATURES = _ptx_signatures()
