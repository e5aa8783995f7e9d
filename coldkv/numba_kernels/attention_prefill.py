"""Tensor-core chunked-prefill attention over the paged, mixed-format KV cache (GPU; emulated
under the simulator).

The decode kernel (attention_mma.py) gives each warp one query token, so a chunk of T tokens
decodes every visible page T times and fills only G of the 16 MMA rows. Here a warp's 16 rows
are (query token, q head) pairs, 16 // G tokens per m-tile, with the causal mask per row, so one
K/V decode serves 16 rows (`_build_prefill`, "rows"), or, in `_build_prefill_smem` ("smem"), the
W warps of a block decode each chunk of keys once into shared memory and all 16 W rows read it.
Same operand decoding, scale handling, online softmax, split plan and workspace as the decode
kernel; docs/kernels.md has the layouts and what was measured.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from coldkv.numba_kernels.attention_cuda import _pos_dev, _pos_int
from coldkv.numba_kernels.attention_mma import _LAZY, _NEG_INF, _VPW, NWARPS, kernel_sig, supports
from coldkv.numba_kernels.mma_ptx import (
    cp_async16_zfill, cp_async_wait_all, dec8_e2m1, dec8_iso3, dec_e2m1, dec_i8, dec_iso3, e4m3x2, ex2, ldg2, ldg4, ldsm_x4, ldsm_x4_t, mma_bf16, mma_f16,
    mul_f16x2, pack_bf16, pack_f16, prmt, sts4, SIMULATED)
from coldkv.numba_kernels.quant import BF16, INT8, ISO3, NVFP4
from coldkv.numba_kernels.wgmma_ptx import bar_arrive, bar_sync, fence_proxy_async, no_wgmma, wgmma


def _build_prefill(kf: int, vf: int, G: int, D: int, devpos: bool, mt: int = 1, max_registers=None):
    """Prefill (T > 1): a warp's 16 MMA rows are (query token, q head) pairs, TPM = 16 // G tokens
    per m-tile and MT m-tiles per warp, so one K/V decode serves MT * TPM query tokens (the decode
    kernel runs one token per warp and uses G of the 16 rows). Grid (query blocks of NWARPS * QT
    tokens, splits of the pages, kv heads): the NWARPS warps of a block take consecutive query
    tokens over the same pages (their loads share L1); blockIdx.y is the split, whose partial goes
    to the workspace as in decode. Per row: the causal mask (key <= its position) and its own
    online softmax. Scales are multiplied into the decoded 16-bit operands, exactly (E2M1 or ISO3
    value x E4M3 scale has <= 7 significant bits and stays below 3136): K per (token, 16-dim
    group) into B, V per (token, group) into A; int8's row scales on the K scores and into P."""
    NS = D // 16
    RWK, RWV = D // _VPW[kf], D // _VPW[vf]
    SW = D // 64
    MT = mt
    TPM = 16 // G  # query tokens per m-tile (rows TPM * G..15 unused when G does not divide 16)
    RU = TPM * G
    QT = MT * TPM  # query tokens per warp
    NT = 2
    CH = 8 * NT
    NT2 = NT // 2
    K4, V4 = kf in (NVFP4, ISO3), vf in (NVFP4, ISO3)
    KW = NS if kf == INT8 else 2 * NS
    mma_k = mma_bf16 if kf == BF16 else mma_f16
    mma_v = mma_bf16 if vf == BF16 else mma_f16
    pack_k = pack_bf16 if kf == BF16 else pack_f16
    pack_v = pack_bf16 if vf == BF16 else pack_f16
    read_pos = _pos_dev if devpos else _pos_int
    IX = np.uint64
    f32 = np.float32
    u32 = np.uint32
    i64 = np.int64

    @cuda.jit(device=True, inline=True)
    def load_v(v_words, v_scales, vreg, vsc, vrs, pv, P, c0, last, tig, gid):
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
    def attn_mma_rows(q, pos, qscale, P, k_words, k_scales, v_words, v_scales, gscale, table, ws_acc, ws_ml):
        pos0 = read_pos(pos)
        T = q.shape[0]
        split = cuda.blockIdx.y
        h = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane >> 2
        tig = lane & 3
        hq0 = h * G
        tq0 = (cuda.blockIdx.x * NWARPS + warp) * QT  # first query token of this warp
        if tq0 >= T:
            return
        tq_last = min(tq0 + QT, T) - 1
        L = pos0 + tq_last + 1  # keys the warp's last token sees
        npages = (L + P - 1) // P
        nsplit = cuda.gridDim.y
        ppw = ((pos0 + T + P - 1) // P + nsplit - 1) // nsplit
        p_begin = split * ppw
        p_end = min(p_begin + ppw, npages)
        kc = f32(1.0) / gscale[0, h]

        # ---- q as the A operand: m-tile mt, row r = (token tq0 + mt*TPM + r // G, head r % G)
        qa = cuda.local.array((MT, NS, 4), np.uint32)
        rpos = cuda.local.array((MT, 2), np.int64)  # position of rows gid, gid + 8: keys <= it
        for m in range(MT):
            for hi in range(2):
                r = gid + 8 * hi
                tq = tq0 + m * TPM + r // G
                rpos[m, hi] = pos0 + min(tq, tq_last)
                ok = r < RU and tq < T
                for s in range(NS):
                    if K4:
                        d0 = 16 * s + tig
                        d1 = d0 + 4
                        d2 = d0 + 8
                        d3 = d0 + 12
                    else:
                        d0 = 16 * s + 4 * tig
                        d1 = d0 + 1
                        d2 = d0 + 2
                        d3 = d0 + 3
                    x0 = f32(0.0)
                    x1 = f32(0.0)
                    x2 = f32(0.0)
                    x3 = f32(0.0)
                    if ok:
                        hq = hq0 + r % G
                        x0 = q[tq, hq, d0] * qscale
                        x1 = q[tq, hq, d1] * qscale
                        x2 = q[tq, hq, d2] * qscale
                        x3 = q[tq, hq, d3] * qscale
                    qa[m, s, hi] = pack_k(x0, x1)  # a0 (row gid) / a1 (row gid + 8)
                    qa[m, s, 2 + hi] = pack_k(x2, x3)  # a2 / a3

        # O^T fragments per (m-tile, n-tile of 8 rows, 16-dim group): (d, row 2tig | 2tig+1)
        acc = cuda.local.array((MT, 2, NS, 4), np.float32)
        for m in range(MT):
            for n in range(2):
                for j in range(NS):
                    for i in range(4):
                        acc[m, n, j, i] = f32(0.0)
        m_run = cuda.local.array((MT, 2), np.float32)  # rows gid, gid + 8 of each m-tile
        l_run = cuda.local.array((MT, 2), np.float32)
        for m in range(MT):
            for hi in range(2):
                m_run[m, hi] = _NEG_INF
                l_run[m, hi] = f32(0.0)
        kreg = cuda.local.array((NT, KW), np.uint32)
        ksw = cuda.local.array((NT, SW), np.uint32)
        krs = cuda.local.array((NT, 2), np.float32)
        sv = cuda.local.array((MT, NT, 4), np.float32)
        vreg = cuda.local.array((NT2, 4, NS), np.uint32)
        vsc = cuda.local.array((NT2, 4, SW), np.uint32)
        vrs = cuda.local.array((NT2, 4), np.float32)
        ck = cuda.local.array(4, np.float32)
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
            last = nval - 1
            for c0 in range(0, nval, CH):
                # ---------------- K loads: the row of token gid of each 8-token tile (clamped)
                for u in range(NT):
                    row = pk * P + min(c0 + 8 * u + gid, last)
                    if K4:
                        for m4 in range(KW // 4):
                            a, b, c, d = ldg4(k_words, row * RWK + 4 * m4)
                            kreg[u, 4 * m4] = a
                            kreg[u, 4 * m4 + 1] = b
                            kreg[u, 4 * m4 + 2] = c
                            kreg[u, 4 * m4 + 3] = d
                        for w in range(SW):  # group scales of the same token (B's column)
                            ksw[u, w] = k_scales[IX(row * SW + w)]
                    elif kf == BF16:
                        for s in range(NS):
                            a, b = ldg2(k_words, row * RWK + 8 * s + 2 * tig)
                            kreg[u, 2 * s] = a
                            kreg[u, 2 * s + 1] = b
                    else:
                        for s in range(NS):
                            kreg[u, s] = k_words[IX(row * RWK + 4 * s + tig)] ^ u32(0x80808080)
                        for i in range(2):  # row scales of the score columns' tokens
                            krs[u, i] = k_scales[IX(pk * P + min(c0 + 8 * u + 2 * tig + i, last))]
                # ---------------- K: scores S[row, tok] of every m-tile from one decode of K
                for u in range(NT):
                    for m in range(MT):
                        for i in range(4):
                            sv[m, u, i] = f32(0.0)
                    for s in range(NS):
                        if K4:
                            w = ksw[u, s >> 2]
                            bsh = u32(s & 3)
                            sp = e4m3x2(w, w, bsh | (bsh << 4))  # (scale, scale) of token gid
                            if kf == NVFP4:
                                b0 = mul_f16x2(dec_e2m1(kreg[u, 2 * s], shk), sp)
                                b1 = mul_f16x2(dec_e2m1(kreg[u, 2 * s + 1], shk), sp)
                            else:
                                b0 = mul_f16x2(dec_iso3(kreg[u, 2 * s], shk), sp)
                                b1 = mul_f16x2(dec_iso3(kreg[u, 2 * s + 1], shk), sp)
                        elif kf == BF16:
                            b0 = kreg[u, 2 * s]
                            b1 = kreg[u, 2 * s + 1]
                        else:
                            w = kreg[u, s]
                            b0 = dec_i8(w, 0x5140)
                            b1 = dec_i8(w, 0x7362)
                        for m in range(MT):
                            r0, r1, r2, r3 = mma_k(qa[m, s, 0], qa[m, s, 1], qa[m, s, 2], qa[m, s, 3], b0, b1,
                                                   sv[m, u, 0], sv[m, u, 1], sv[m, u, 2], sv[m, u, 3])
                            sv[m, u, 0] = r0
                            sv[m, u, 1] = r1
                            sv[m, u, 2] = r2
                            sv[m, u, 3] = r3
                    if K4:
                        ck[0] = kc
                        ck[1] = kc
                    elif kf == INT8:
                        ck[0] = krs[u, 0]
                        ck[1] = krs[u, 1]
                    else:
                        ck[0] = f32(1.0)
                        ck[1] = f32(1.0)
                    tok = c0 + 8 * u + 2 * tig  # in-page index of columns 2tig, 2tig + 1
                    kp = p * P + tok  # their key position: causal mask per row
                    for m in range(MT):
                        for i in range(4):
                            x = sv[m, u, i] * ck[i & 1]
                            ok = tok + (i & 1) < nval and kp + (i & 1) <= rpos[m, i >> 1]
                            sv[m, u, i] = x if ok else _NEG_INF
                load_v(v_words, v_scales, vreg, vsc, vrs, pv, P, c0, last, tig, gid)
                # ---------------- softmax per row (rows gid, gid + 8 of each m-tile; 4 lanes a row)
                for m in range(MT):
                    for hi in range(2):
                        mx = _NEG_INF
                        for u in range(NT):
                            mx = max(mx, max(sv[m, u, 2 * hi], sv[m, u, 2 * hi + 1]))
                        mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
                        mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
                        ck[hi] = mx
                    need0 = ck[0] > m_run[m, 0] + _LAZY
                    need1 = ck[1] > m_run[m, 1] + _LAZY
                    if cuda.any_sync(0xFFFFFFFF, need0 or need1):  # rare: a running max moves
                        # (a row that has seen no key yet has m = -inf: alpha only where it moves)
                        al0 = f32(1.0)
                        al1 = f32(1.0)
                        if need0:
                            al0 = math.exp2(m_run[m, 0] - ck[0])
                            m_run[m, 0] = ck[0]
                            l_run[m, 0] *= al0
                        if need1:
                            al1 = math.exp2(m_run[m, 1] - ck[1])
                            m_run[m, 1] = ck[1]
                            l_run[m, 1] *= al1
                        # acc column (row) 2tig + i of n-tile n: alpha of row 8n + 2tig + i, held by
                        # lane 4 (2tig + i) in slot n
                        a00 = cuda.shfl_sync(0xFFFFFFFF, al0, 8 * tig)
                        a01 = cuda.shfl_sync(0xFFFFFFFF, al0, 8 * tig + 4)
                        a10 = cuda.shfl_sync(0xFFFFFFFF, al1, 8 * tig)
                        a11 = cuda.shfl_sync(0xFFFFFFFF, al1, 8 * tig + 4)
                        for j in range(NS):
                            acc[m, 0, j, 0] *= a00
                            acc[m, 0, j, 1] *= a01
                            acc[m, 0, j, 2] *= a00
                            acc[m, 0, j, 3] *= a01
                            acc[m, 1, j, 0] *= a10
                            acc[m, 1, j, 1] *= a11
                            acc[m, 1, j, 2] *= a10
                            acc[m, 1, j, 3] *= a11
                    for u in range(NT):
                        for i in range(4):
                            sc = sv[m, u, i]
                            pr = math.exp2(sc - m_run[m, i >> 1]) if sc > _NEG_INF else f32(0.0)
                            l_run[m, i >> 1] += pr
                            sv[m, u, i] = pr
                # ---------------- V: O^T += V^T P^T per 16-token step; one V decode, 2 MT n-tiles
                for v in range(NT2):
                    for j in range(NS):
                        x0 = vreg[v, 0, j]
                        x1 = vreg[v, 1, j]
                        x2 = vreg[v, 2, j]
                        x3 = vreg[v, 3, j]
                        if V4:
                            w = j >> 2
                            bsh = u32(j & 3)
                            sp01 = e4m3x2(vsc[v, 0, w], vsc[v, 1, w], bsh | ((bsh + 4) << 4))  # tokens t0 | t1
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
                        for m in range(MT):
                            for n in range(2):
                                # B = P^T of rows 8n..8n+7: tokens 2tig, 2tig+1 | 2tig+8, 2tig+9
                                p0 = sv[m, 2 * v, 2 * n]
                                p1 = sv[m, 2 * v, 2 * n + 1]
                                p2 = sv[m, 2 * v + 1, 2 * n]
                                p3 = sv[m, 2 * v + 1, 2 * n + 1]
                                if vf == INT8:
                                    bb0 = pack_v(p0 * vrs[v, 0], p1 * vrs[v, 1])
                                    bb1 = pack_v(p2 * vrs[v, 2], p3 * vrs[v, 3])
                                else:
                                    bb0 = pack_v(p0, p1)
                                    bb1 = pack_v(p2, p3)
                                r0, r1, r2, r3 = mma_v(a0, a1, a2, a3, bb0, bb1, acc[m, n, j, 0], acc[m, n, j, 1],
                                                       acc[m, n, j, 2], acc[m, n, j, 3])
                                acc[m, n, j, 0] = r0
                                acc[m, n, j, 1] = r1
                                acc[m, n, j, 2] = r2
                                acc[m, n, j, 3] = r3

        # ---------------- the warp's partials, one per valid row
        vc = f32(1.0)
        if V4:
            vc = f32(1.0) / gscale[1, h]
        for m in range(MT):
            for hi in range(2):
                x = l_run[m, hi]
                x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 1)
                x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 2)
                r = gid + 8 * hi
                tq = tq0 + m * TPM + r // G
                if tig == 0 and r < RU and tq < T:
                    ws_ml[split, tq, hq0 + r % G, 0] = m_run[m, hi]
                    ws_ml[split, tq, hq0 + r % G, 1] = x
            for n in range(2):
                for i in range(2):
                    r = 8 * n + 2 * tig + i
                    tq = tq0 + m * TPM + r // G
                    if r < RU and tq < T:
                        hq = hq0 + r % G
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
                            ws_acc[split, tq, hq, dr] = acc[m, n, j, i] * vc
                            ws_acc[split, tq, hq, dr8] = acc[m, n, j, 2 + i] * vc

    return attn_mma_rows


def _build_prefill_smem(kf: int, vf: int, G: int, D: int, devpos: bool, W: int = 4, CHB: int = 0,
                        max_registers=None):
    """Prefill with the K/V decode shared by the block: the W warps of a block (W * 16 rows, one
    m-tile each, rows as in `_build_prefill`) decode a chunk of CHB keys of K and V together into
    shared memory as 16-bit operands (scales multiplied in exactly, as there; V transposed), then
    each warp runs the flash-attention inner loop on its rows from shared memory:
      S = Q K^T   A = q (registers), B = K^T: one 64-bit shared load per (8-key tile, k16 step)
      O = P V     A = P (the S accumulators, FA2 register reuse), B = V: one 64-bit shared load per
                  (16-key step, 8-dim tile); O [16 rows, D] in registers, rescaled per row.
    The k order inside a k16 step is free (A and B only have to agree), so a lane's two B words are
    adjacent in shared memory: K rows hold dims in the order the q packing uses, and the tile
    columns map to keys 16(u >> 1) + 4(c >> 1) + 2(u & 1) + (c & 1), which makes P's A fragment of a
    16-key step the keys 4 tig .. 4 tig + 3 that the V load reads. K rows are XOR-swizzled per 8-word
    block by (key & 1) | (key >> 1 & 2), so the 64-bit K loads of a half-warp hit 32 distinct banks;
    V rows are padded by 8 words for the same reason. Keys of unallocated pages, and past the
    block's last query, are decoded as zeros and masked."""
    NS = D // 16
    RWK, RWV = D // _VPW[kf], D // _VPW[vf]
    SW = D // 64
    CHB = CHB or (64 if D <= 128 else 32)  # keys per chunk: shared memory K + V^T <= 40 KB
    NKT = CHB // 8  # 8-key tiles of S
    NVS = CHB // 16  # 16-key steps of the V product
    ND8 = D // 8  # 8-dim tiles of O
    TPM = 16 // G
    RU = TPM * G
    TH = 32 * W
    RSK = D // 2  # words per K row (fp16 pairs), a multiple of 32: swizzled, not padded
    RSV = CHB // 2 + 8  # words per V^T row (key pairs), padded
    K4, V4 = kf in (NVFP4, ISO3), vf in (NVFP4, ISO3)
    mma_k = mma_bf16 if kf == BF16 else mma_f16
    mma_v = mma_bf16 if vf == BF16 else mma_f16
    pack_k = pack_bf16 if kf == BF16 else pack_f16
    pack_v = pack_bf16 if vf == BF16 else pack_f16
    dec4k = dec_iso3 if kf == ISO3 else dec_e2m1
    dec4v = dec_iso3 if vf == ISO3 else dec_e2m1
    read_pos = _pos_dev if devpos else _pos_int
    IX = np.uint64
    f32 = np.float32
    u32 = np.uint32
    u64 = np.uint64
    i64 = np.int64
    NKI = CHB * (RWK // 2 if kf == BF16 else RWK)  # K decode items: (key, word) (bf16: word pair)
    NVI = (CHB // 4) * RWV  # V decode items: (4 keys, word)
    KSN, VSN = CHB * RSK // 2, D * RSV // 2  # shared u64 words of K and V^T (literal shapes)

    @cuda.jit(device=True, inline=True)
    def kphys(key, dp):
        """u64 index of K pair words (dp, dp + 1) (dp even) of chunk key `key`, swizzled."""
        sw = (key & 1) | ((key >> 1) & 2)
        return IX((key * RSK + (((dp >> 3) ^ sw) << 3) + (dp & 7)) >> 1)

    jit = cuda.jit(max_registers=max_registers) if max_registers else cuda.jit

    @jit
    def attn_mma_smem(q, pos, qscale, P, k_words, k_scales, v_words, v_scales, gscale, table, ws_acc, ws_ml):
        ks = cuda.shared.array(KSN, np.uint64)
        vs = cuda.shared.array(VSN, np.uint64)
        rows = cuda.shared.array((2, CHB), np.int64)
        ksr = cuda.shared.array(CHB, np.float32)  # int8 row scales of the chunk's keys
        vsr = cuda.shared.array(CHB, np.float32)
        pos0 = read_pos(pos)
        T = q.shape[0]
        split = cuda.blockIdx.y
        h = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane >> 2
        tig = lane & 3
        hq0 = h * G
        tqb0 = cuda.blockIdx.x * (W * TPM)  # first query token of the block
        tqb_last = min(tqb0 + W * TPM, T) - 1
        tq0 = tqb0 + warp * TPM  # of this warp
        active = tq0 < T  # warps past the chunk still decode and synchronise
        tq_last = min(tq0 + TPM, T) - 1
        Lb = pos0 + tqb_last + 1  # keys the block's last token sees
        nsplit = cuda.gridDim.y
        ppw = ((pos0 + T + P - 1) // P + nsplit - 1) // nsplit
        kb = split * ppw * P
        ke = min((split * ppw + ppw) * P, Lb)
        kc = f32(1.0) / gscale[0, h]

        qa = cuda.local.array((NS, 4), np.uint32)
        rpos = cuda.local.array(2, np.int64)
        for hi in range(2):
            r = gid + 8 * hi
            tq = tq0 + r // G
            rpos[hi] = pos0 + min(tq, tq_last)
            ok = active and r < RU and tq < T
            for s in range(NS):
                if K4:  # shared K rows hold (dim j, dim j + 4) pairs of each code word
                    d0 = 16 * s + 8 * (tig >> 1) + 2 * (tig & 1)
                    d1 = d0 + 4
                    d2 = d0 + 1
                    d3 = d0 + 5
                else:
                    d0 = 16 * s + 4 * tig
                    d1 = d0 + 1
                    d2 = d0 + 2
                    d3 = d0 + 3
                x0 = f32(0.0)
                x1 = f32(0.0)
                x2 = f32(0.0)
                x3 = f32(0.0)
                if ok:
                    hq = hq0 + r % G
                    x0 = q[tq, hq, d0] * qscale
                    x1 = q[tq, hq, d1] * qscale
                    x2 = q[tq, hq, d2] * qscale
                    x3 = q[tq, hq, d3] * qscale
                qa[s, hi] = pack_k(x0, x1)
                qa[s, 2 + hi] = pack_k(x2, x3)
        acc = cuda.local.array((ND8, 4), np.float32)  # O: (row gid | gid + 8, dim 8 n + 2 tig | + 1)
        for n in range(ND8):
            for i in range(4):
                acc[n, i] = f32(0.0)
        m0 = _NEG_INF
        m1 = _NEG_INF
        l0 = f32(0.0)
        l1 = f32(0.0)
        sv = cuda.local.array((NKT, 4), np.float32)
        ck = cuda.local.array(2, np.float32)

        for k0 in range(kb, ke, CHB):
            # Every warp must be done with the previous chunk before its row table and int8 row
            # scales are overwritten: the MMA phase reads rows[0] (key mask), ksr and vsr. Without
            # this barrier warps 0-1 (tid < CHB) could rewrite them while warp 2 or 3 still used
            # them: on the H200 (4e6dd62) one warp's 8 tokens differed between two launches.
            cuda.syncthreads()
            # ---- rows of the chunk's keys (-1: unallocated page or past the block's keys)
            if tid < CHB:
                key = k0 + tid
                rk = i64(-1)
                rv = i64(-1)
                if key < ke:
                    pg = key // P
                    ek = i64(table[0, h, IX(pg)])
                    ev = i64(table[1, h, IX(pg)])
                    if ek >= 0 and ev >= 0:
                        rk = ek * P + (key - pg * P)
                        rv = ev * P + (key - pg * P)
                rows[0, tid] = rk
                rows[1, tid] = rv
                if kf == INT8:
                    ksr[tid] = k_scales[IX(rk)] if rk >= 0 else f32(0.0)
                if vf == INT8:
                    vsr[tid] = v_scales[IX(rv)] if rv >= 0 else f32(0.0)
            cuda.syncthreads()  # rows and row scales are ready
            # ---- decode K: item (key, code word); zeros for invalid keys
            for it in range(tid, NKI, TH):
                if kf == BF16:
                    key = it // (RWK // 2)
                    wi = 2 * (it % (RWK // 2))
                else:
                    key = it // RWK
                    wi = it % RWK
                row = rows[0, key]
                lo = u32(0)
                hi = u32(0)
                lo2 = u32(0)
                hi2 = u32(0)
                if row >= 0:
                    if K4:
                        x = k_words[IX(row * RWK + wi)]
                        g = wi >> 1
                        sw = k_scales[IX(row * SW + (g >> 2))]
                        bsh = u32(g & 3)
                        sp = e4m3x2(sw, sw, bsh | (bsh << 4))
                        lo = mul_f16x2(dec4k(x, u32(0)), sp)
                        hi = mul_f16x2(dec4k(x, u32(4)), sp)
                        lo2 = mul_f16x2(dec4k(x, u32(8)), sp)
                        hi2 = mul_f16x2(dec4k(x, u32(12)), sp)
                    elif kf == BF16:
                        lo, hi = ldg2(k_words, row * RWK + wi)
                    else:
                        x = k_words[IX(row * RWK + wi)] ^ u32(0x80808080)
                        lo = dec_i8(x, 0x5140)
                        hi = dec_i8(x, 0x7362)
                if K4:  # pairs 4 wi + j = (dim 8 wi + j, dim 8 wi + j + 4)
                    ks[kphys(key, 4 * wi)] = u64(lo) | (u64(hi) << u64(32))
                    ks[kphys(key, 4 * wi + 2)] = u64(lo2) | (u64(hi2) << u64(32))
                elif kf == BF16:  # words wi, wi + 1 = dims 2 wi .. 2 wi + 3
                    ks[kphys(key, wi)] = u64(lo) | (u64(hi) << u64(32))
                else:  # word wi = dims 4 wi .. 4 wi + 3 = pairs 2 wi, 2 wi + 1
                    ks[kphys(key, 2 * wi)] = u64(lo) | (u64(hi) << u64(32))
            # ---- decode V^T: item (4 keys, code word): per dim, the 4 keys' values (2 pair words)
            for it in range(tid, NVI, TH):
                qd = it % (CHB // 4)
                wi = it // (CHB // 4)
                x0 = u32(0)
                x1 = u32(0)
                x2 = u32(0)
                x3 = u32(0)
                s0 = u32(0)
                s1 = u32(0)
                s2 = u32(0)
                s3 = u32(0)
                r0 = rows[1, 4 * qd]
                r1 = rows[1, 4 * qd + 1]
                r2 = rows[1, 4 * qd + 2]
                r3 = rows[1, 4 * qd + 3]
                if V4:
                    g = wi >> 1
                    if r0 >= 0:
                        x0 = v_words[IX(r0 * RWV + wi)]
                        s0 = v_scales[IX(r0 * SW + (g >> 2))]
                    if r1 >= 0:
                        x1 = v_words[IX(r1 * RWV + wi)]
                        s1 = v_scales[IX(r1 * SW + (g >> 2))]
                    if r2 >= 0:
                        x2 = v_words[IX(r2 * RWV + wi)]
                        s2 = v_scales[IX(r2 * SW + (g >> 2))]
                    if r3 >= 0:
                        x3 = v_words[IX(r3 * RWV + wi)]
                        s3 = v_scales[IX(r3 * SW + (g >> 2))]
                    bsh = u32(g & 3)
                    sp01 = e4m3x2(s0, s1, bsh | ((bsh + 4) << 4))  # (scale of key 0 | key 1)
                    sp23 = e4m3x2(s2, s3, bsh | ((bsh + 4) << 4))
                    for n in range(4):  # dims 8 wi + n and 8 wi + n + 4
                        sh = u32(4 * n)
                        y0 = x0 >> sh
                        y1 = x1 >> sh
                        y2 = x2 >> sh
                        y3 = x3 >> sh
                        a01 = mul_f16x2(dec4v(prmt(y0, y1, 0x5410), u32(0)), sp01)
                        a23 = mul_f16x2(dec4v(prmt(y2, y3, 0x5410), u32(0)), sp23)
                        b01 = mul_f16x2(dec4v(prmt(y0, y1, 0x7632), u32(0)), sp01)
                        b23 = mul_f16x2(dec4v(prmt(y2, y3, 0x7632), u32(0)), sp23)
                        dm = 8 * wi + n
                        vs[IX(dm * (RSV // 2) + qd)] = u64(a01) | (u64(a23) << u64(32))
                        vs[IX((dm + 4) * (RSV // 2) + qd)] = u64(b01) | (u64(b23) << u64(32))
                elif vf == BF16:
                    if r0 >= 0:
                        x0 = v_words[IX(r0 * RWV + wi)]
                    if r1 >= 0:
                        x1 = v_words[IX(r1 * RWV + wi)]
                    if r2 >= 0:
                        x2 = v_words[IX(r2 * RWV + wi)]
                    if r3 >= 0:
                        x3 = v_words[IX(r3 * RWV + wi)]
                    dm = 2 * wi
                    vs[IX(dm * (RSV // 2) + qd)] = u64(prmt(x0, x1, 0x5410)) | (u64(prmt(x2, x3, 0x5410)) << u64(32))
                    vs[IX((dm + 1) * (RSV // 2) + qd)] = (u64(prmt(x0, x1, 0x7632))
                                                          | (u64(prmt(x2, x3, 0x7632)) << u64(32)))
                else:
                    # int8: x ^ 0x80 per byte; an invalid key reads as code 0 (0x80 after the xor)
                    x0 = u32(0x80808080)
                    x1 = u32(0x80808080)
                    x2 = u32(0x80808080)
                    x3 = u32(0x80808080)
                    if r0 >= 0:
                        x0 = v_words[IX(r0 * RWV + wi)] ^ u32(0x80808080)
                    if r1 >= 0:
                        x1 = v_words[IX(r1 * RWV + wi)] ^ u32(0x80808080)
                    if r2 >= 0:
                        x2 = v_words[IX(r2 * RWV + wi)] ^ u32(0x80808080)
                    if r3 >= 0:
                        x3 = v_words[IX(r3 * RWV + wi)] ^ u32(0x80808080)
                    for b in range(4):  # dim 4 wi + b: byte b of the 4 keys
                        sel = u32(b | ((4 + b) << 4))
                        a01 = dec_i8(prmt(x0, x1, sel), 0x5140)
                        a23 = dec_i8(prmt(x2, x3, sel), 0x5140)
                        dm = 4 * wi + b
                        vs[IX(dm * (RSV // 2) + qd)] = u64(a01) | (u64(a23) << u64(32))
            cuda.syncthreads()
            if active and k0 <= pos0 + tq_last:  # else every row of the warp is masked
                # ---- S = Q K^T per 8-key tile
                for u in range(NKT):
                    c_0 = f32(0.0)
                    c_1 = f32(0.0)
                    c_2 = f32(0.0)
                    c_3 = f32(0.0)
                    kl = 16 * (u >> 1) + 4 * (gid >> 1) + 2 * (u & 1) + (gid & 1)  # B column gid's key
                    for s in range(NS):
                        w = ks[kphys(kl, 8 * s + 2 * tig)]
                        c_0, c_1, c_2, c_3 = mma_k(qa[s, 0], qa[s, 1], qa[s, 2], qa[s, 3], u32(w & u64(0xFFFFFFFF)),
                                                   u32(w >> u64(32)), c_0, c_1, c_2, c_3)
                    kc0 = 16 * (u >> 1) + 4 * tig + 2 * (u & 1)  # key of columns 2 tig (+1)
                    if K4:
                        ck[0] = kc
                        ck[1] = kc
                    elif kf == INT8:
                        ck[0] = ksr[kc0]
                        ck[1] = ksr[kc0 + 1]
                    else:
                        ck[0] = f32(1.0)
                        ck[1] = f32(1.0)
                    ok0 = rows[0, kc0] >= 0
                    ok1 = rows[0, kc0 + 1] >= 0
                    kp = k0 + kc0
                    sv[u, 0] = c_0 * ck[0] if ok0 and kp <= rpos[0] else _NEG_INF
                    sv[u, 1] = c_1 * ck[1] if ok1 and kp + 1 <= rpos[0] else _NEG_INF
                    sv[u, 2] = c_2 * ck[0] if ok0 and kp <= rpos[1] else _NEG_INF
                    sv[u, 3] = c_3 * ck[1] if ok1 and kp + 1 <= rpos[1] else _NEG_INF
                # ---- online softmax, rows gid (slots 0, 1) and gid + 8 (2, 3)
                mx0 = _NEG_INF
                mx1 = _NEG_INF
                for u in range(NKT):
                    mx0 = max(mx0, max(sv[u, 0], sv[u, 1]))
                    mx1 = max(mx1, max(sv[u, 2], sv[u, 3]))
                mx0 = max(mx0, cuda.shfl_xor_sync(0xFFFFFFFF, mx0, 1))
                mx0 = max(mx0, cuda.shfl_xor_sync(0xFFFFFFFF, mx0, 2))
                mx1 = max(mx1, cuda.shfl_xor_sync(0xFFFFFFFF, mx1, 1))
                mx1 = max(mx1, cuda.shfl_xor_sync(0xFFFFFFFF, mx1, 2))
                if mx0 > m0 + _LAZY:  # per row (the 4 lanes of a row agree): rare
                    al = math.exp2(m0 - mx0)
                    m0 = mx0
                    l0 *= al
                    for n in range(ND8):
                        acc[n, 0] *= al
                        acc[n, 1] *= al
                if mx1 > m1 + _LAZY:
                    al = math.exp2(m1 - mx1)
                    m1 = mx1
                    l1 *= al
                    for n in range(ND8):
                        acc[n, 2] *= al
                        acc[n, 3] *= al
                for u in range(NKT):
                    for i in range(4):
                        sc = sv[u, i]
                        pr = math.exp2(sc - (m0 if i < 2 else m1)) if sc > _NEG_INF else f32(0.0)
                        if i < 2:
                            l0 += pr
                        else:
                            l1 += pr
                        sv[u, i] = pr
                # ---- O += P V per 16-key step: A = P (keys 4 tig .. + 3 of the step), B = V^T rows
                for v in range(NVS):
                    p0 = sv[2 * v, 0]
                    p1 = sv[2 * v, 1]
                    p2 = sv[2 * v + 1, 0]
                    p3 = sv[2 * v + 1, 1]
                    p4 = sv[2 * v, 2]
                    p5 = sv[2 * v, 3]
                    p6 = sv[2 * v + 1, 2]
                    p7 = sv[2 * v + 1, 3]
                    if vf == INT8:
                        kv0 = 16 * v + 4 * tig
                        r0s = vsr[kv0]
                        r1s = vsr[kv0 + 1]
                        r2s = vsr[kv0 + 2]
                        r3s = vsr[kv0 + 3]
                        a0 = pack_v(p0 * r0s, p1 * r1s)
                        a1 = pack_v(p4 * r0s, p5 * r1s)
                        a2 = pack_v(p2 * r2s, p3 * r3s)
                        a3 = pack_v(p6 * r2s, p7 * r3s)
                    else:
                        a0 = pack_v(p0, p1)  # row gid, keys 4 tig, 4 tig + 1
                        a1 = pack_v(p4, p5)  # row gid + 8
                        a2 = pack_v(p2, p3)  # row gid, keys 4 tig + 2, + 3
                        a3 = pack_v(p6, p7)
                    for n in range(ND8):
                        w = vs[IX((8 * n + gid) * (RSV // 2) + 4 * v + tig)]
                        r0, r1, r2, r3 = mma_v(a0, a1, a2, a3, u32(w & u64(0xFFFFFFFF)), u32(w >> u64(32)),
                                               acc[n, 0], acc[n, 1], acc[n, 2], acc[n, 3])
                        acc[n, 0] = r0
                        acc[n, 1] = r1
                        acc[n, 2] = r2
                        acc[n, 3] = r3

        # ---- the warp's partials
        if active:
            vc = f32(1.0)
            if V4:
                vc = f32(1.0) / gscale[1, h]
            l0 += cuda.shfl_xor_sync(0xFFFFFFFF, l0, 1)
            l0 += cuda.shfl_xor_sync(0xFFFFFFFF, l0, 2)
            l1 += cuda.shfl_xor_sync(0xFFFFFFFF, l1, 1)
            l1 += cuda.shfl_xor_sync(0xFFFFFFFF, l1, 2)
            for hi in range(2):
                r = gid + 8 * hi
                tq = tq0 + r // G
                if r < RU and tq < T:
                    hq = hq0 + r % G
                    if tig == 0:
                        ws_ml[split, tq, hq, 0] = m0 if hi == 0 else m1
                        ws_ml[split, tq, hq, 1] = l0 if hi == 0 else l1
                    for n in range(ND8):
                        dm = 8 * n + 2 * tig
                        ws_acc[split, tq, hq, dm] = acc[n, 2 * hi] * vc
                        ws_acc[split, tq, hq, dm + 1] = acc[n, 2 * hi + 1] * vc

    return attn_mma_smem


def _build_prefill_fa(kf: int, vf: int, G: int, D: int, devpos: bool, W: int = 4, max_registers=None,
                      pre: tuple = (False, False), wg: bool = False, chb: int = 0, pingpong: bool = False):
    """Prefill, FlashAttention-2 style on mma.sync ("fa"): the W warps of a block (16 rows each,
    rows as in `_build_prefill`) share K/V tiles of CHB keys in shared memory, double-buffered, one
    barrier per tile. While the warps compute tile i, tile i + 1 is brought in: bf16 planes by
    cp.async (zero-filled for invalid keys), the other formats as code words into registers that are
    decoded (scales multiplied in exactly, as in the other kernels) and stored after the compute.
    Shared rows are 16-bit [key][dim] (4-bit formats: each 8-dim chunk in the order d0 d4 d1 d5 d2
    d6 d3 d7, the decoder's natural pairs; q and the output use the same order), 16-byte chunks
    XOR-swizzled by key & 7, read with ldmatrix: K non-transposed as the B operand of S = Q K^T,
    V transposed as the B operand of O += P V. Q stays in registers; P is the S accumulator
    re-packed (FA2); online softmax per row as in the other kernels; only tiles that reach past a
    warp's first query position (the diagonal), past the split's end, or a block with unallocated
    pages in its range are masked.

    pre (K, V): that 4-bit plane comes pre-decoded (`launch_predecode`: the fp16 shared rows,
    already multiplied by their E4M3 scales, in a [pool rows, D / 2] uint32 scratch), so its
    tiles are brought in by cp.async like bf16 ones and no block decodes them: the shared tiles,
    hence the outputs, are bitwise those of the decoding build.

    wg ("wg", sm_90a): the MMAs are Hopper warpgroup MMAs (wgmma_ptx.py), a warpgroup's 64 rows
    at once with K and V read from shared memory by descriptor: S = Q K^T as m64 n CHB, O += P V
    as m64 n D with P from registers. The tiles are stored as 8x8 core matrices ([key / 8][dim /
    8][8 keys][16 bytes], `wg_off`), the layout wgmma reads without swizzle, and live in dynamic
    shared memory (`wg_smem_bytes`: 64 KB at CHB 64, d 128; the launcher raises the kernel's
    limit). pingpong (wg, 8 warps): the two warpgroups take turns on the tensor cores through named
    barriers (FA3's schedule; `bar_sync`/`bar_arrive` in the loop). chb: keys per tile (default 4096 / D, wg 8192 / D, also its maximum: 128-key tiles at d
    128 gave wrong outputs on the H200 at cbac499 and 5f25e53, while their simulator case passed)."""
    if (pre[0] and kf not in (NVFP4, ISO3)) or (pre[1] and vf not in (NVFP4, ISO3)):
        raise ValueError("attention_prefill: only nvfp4/iso3 planes come pre-decoded")
    if wg and (D > 128 or W % 4):
        raise ValueError("attention_prefill: the wgmma kernel needs head_dim <= 128 and whole warpgroups")
    if wg and chb * D > 8192:  # 128-key tiles at d 128 passed the simulator but were wrong on the H200
        raise ValueError("attention_prefill: the wgmma kernel's tiles are at most 8192 / head_dim keys")
    NS = D // 16
    NC = D // 8  # 16-byte chunks (8 dims) of a shared row
    RS = D // 2  # u32 words of a shared row
    CHB = chb or (8192 if wg else 4096) // D  # keys per tile: shared K + V, two buffers = 32 KB (wg 64 KB)
    NKT = CHB // 8
    NVS = CHB // 16
    ND8 = D // 8
    TPM = 16 // G
    RU = TPM * G
    TH = 32 * W
    NIT = CHB * NC // TH  # load items (key, chunk) per thread per plane and tile
    KPI = TH // NC  # key stride between a thread's items
    BUFW = CHB * RS
    SBW, SCH = 2 * BUFW, 2 * CHB  # shared array sizes (literal shapes)
    SIM = SIMULATED
    RWK, RWV = D // _VPW[BF16 if pre[0] else kf], D // _VPW[BF16 if pre[1] else vf]
    SW = D // 64
    K4, V4 = kf in (NVFP4, ISO3), vf in (NVFP4, ISO3)
    mma_k = mma_bf16 if kf == BF16 else mma_f16
    mma_v = mma_bf16 if vf == BF16 else mma_f16
    pack_k = pack_bf16 if kf == BF16 else pack_f16
    pack_v = pack_bf16 if vf == BF16 else pack_f16
    read_pos = _pos_dev if devpos else _pos_int
    IX = np.uint64
    f32 = np.float32
    u32 = np.uint32
    i64 = np.int64
    WG = wg
    PP = wg and pingpong and W == 8
    wg_s = wg_pv = no_wgmma
    if WG:  # K-major K: LBO the next dim core, SBO the next key core; V N-major: the other way
        wg_s = wgmma(CHB, NS, kf == BF16, False, False, 128, NC * 128, 256)
        wg_pv = wgmma(D, NVS, vf == BF16, True, True, NC * 128, 128, 2 * NC * 128)

    @cuda.jit(device=True, inline=True)
    def soff(key, c):
        """Word offset of (key, 16-byte chunk c) in a tile: core matrices for wgmma, else rows
        with the chunks XOR-swizzled by key & 7 (conflict-free ldmatrix)."""
        if WG:
            return ((key >> 3) * NC + c) * 32 + (key & 7) * 4
        return key * RS + 4 * (c ^ (key & 7))

    @cuda.jit(device=True)
    def key_scale(ksr, i, kc):
        """What a score of shared key i is multiplied by: the 4-bit plane's 1 / g, an int8 row
        scale, or 1 (bf16)."""
        if K4:
            return kc
        if kf == INT8:
            return ksr[i]
        return f32(1.0)

    def plane_ops(fmt, RW, pre_decoded):
        dec8 = dec8_iso3 if fmt == ISO3 else dec8_e2m1
        copy = fmt == BF16 or pre_decoded  # 16-bit rows: straight into shared memory

        @cuda.jit(device=True, inline=True)
        def issue(words, scales, sarr, base, rows, creg, crs, c, key0, allok):
            """Start bringing items j (key key0 + KPI j, chunk c; rows[j] < 0: invalid) of the
            next tile in: bf16 by cp.async into sarr, the others into registers. allok (a
            constant): every row is valid, so no per-item test is compiled."""
            for j in range(NIT):
                r = rows[j]
                ok = allok or r >= 0
                rr = r if ok else i64(0)
                key = key0 + KPI * j
                if copy:
                    cp_async16_zfill(sarr, base + soff(key, c), words, IX(rr * RW + 4 * c),
                               16 if ok else 0)
                elif fmt == INT8:
                    x0 = words[IX(rr * RW + 2 * c)]
                    x1 = words[IX(rr * RW + 2 * c + 1)]
                    creg[j, 0] = x0 if ok else u32(0)
                    creg[j, 1] = x1 if ok else u32(0)
                    sc = scales[IX(rr)]
                    crs[j] = sc if ok else f32(0.0)
                else:
                    x0 = words[IX(rr * RW + c)]
                    x1 = scales[IX(rr * SW + (c >> 3))]
                    creg[j, 0] = x0 if ok else u32(0)
                    creg[j, 1] = x1 if ok else u32(0)

        @cuda.jit(device=True, inline=True)
        def commit(sarr, base, creg, c, key0):
            """Decode the registers of `issue` into sarr (bf16, pre-decoded: nothing, cp.async wrote it)."""
            if not copy:
                for j in range(NIT):
                    key = key0 + KPI * j
                    if fmt == INT8:
                        x0 = creg[j, 0] ^ u32(0x80808080)
                        x1 = creg[j, 1] ^ u32(0x80808080)
                        y0 = dec_i8(x0, 0x5140)
                        y1 = dec_i8(x0, 0x7362)
                        y2 = dec_i8(x1, 0x5140)
                        y3 = dec_i8(x1, 0x7362)
                    else:
                        x = creg[j, 0]
                        sw = creg[j, 1]
                        bsh = u32((c >> 1) & 3)
                        sp = e4m3x2(sw, sw, bsh | (bsh << 4))
                        z0, z1, z2, z3 = dec8(x)
                        y0 = mul_f16x2(z0, sp)
                        y1 = mul_f16x2(z1, sp)
                        y2 = mul_f16x2(z2, sp)
                        y3 = mul_f16x2(z3, sp)
                    sts4(sarr, base + soff(key, c), y0, y1, y2, y3)

        return issue, commit

    issue_k, commit_k = plane_ops(kf, RWK, pre[0])
    issue_v, commit_v = plane_ops(vf, RWV, pre[1])

    @cuda.jit(device=True, inline=True)
    def item_rows(table, h, P, fastp, k0, ke, ipg, ioff, key0, rk, rv, okb):
        """Global rows of the thread's items of the tile at k0 (-1: past ke or an unallocated
        page); fastp (P a multiple of CHB): the tile lies in page ipg from offset ioff."""
        ek = i64(0)
        ev = i64(0)
        if fastp and k0 < ke:
            ek = i64(table[0, h, IX(ipg)])
            ev = i64(table[1, h, IX(ipg)])
        for j in range(NIT):
            key = key0 + KPI * j
            g = k0 + key
            r_k = i64(-1)
            r_v = i64(-1)
            if g < ke:
                if fastp:
                    e_k = ek
                    e_v = ev
                    off = ioff + key
                else:
                    pg = g // P
                    off = g - pg * P
                    e_k = i64(table[0, h, IX(pg)])
                    e_v = i64(table[1, h, IX(pg)])
                if e_k >= 0 and e_v >= 0:
                    r_k = e_k * P + off
                    r_v = e_v * P + off
            rk[j] = r_k
            rv[j] = r_v
            okb[j] = 1 if r_k >= 0 else 0

    jit = cuda.jit(max_registers=max_registers) if max_registers else cuda.jit

    @jit
    def attn_mma_fa(q, pos, qscale, P, k_words, k_scales, v_words, v_scales, gscale, table, ws_acc, ws_ml):
        if WG:  # dynamic: [K buffers | V buffers], 64 KB at d 128
            if SIM:  # (the simulator sizes a dynamic array by a dtype instance's itemsize)
                dyn = cuda.shared.array(0, np.dtype(np.uint32))
            else:
                dyn = cuda.shared.array(0, np.uint32, alignment=128)
            KS = dyn[:SBW]
            VS = dyn[SBW:]
        elif SIM:  # the simulator refuses an alignment
            KS = cuda.shared.array(SBW, np.uint32)
            VS = cuda.shared.array(SBW, np.uint32)
        else:  # ldmatrix / st.shared.v4 / cp.async need 16-byte aligned rows
            KS = cuda.shared.array(SBW, np.uint32, alignment=16)
            VS = cuda.shared.array(SBW, np.uint32, alignment=16)
        ksr = cuda.shared.array(SCH, np.float32)  # int8 row scales of the keys
        vsr = cuda.shared.array(SCH, np.float32)
        kval = cuda.shared.array(SCH, np.int32)  # key valid (read only in blocks with holes)
        pos0 = read_pos(pos)
        T = q.shape[0]
        split = cuda.blockIdx.y
        # blocks are dispatched in index order: heaviest first (a causal chunk's last query
        # blocks see the most keys) with the kv heads interleaved, so the blocks that start last
        # are the short ones (longest-processing-time-first balancing of an unsplit chunk)
        xz = cuda.blockIdx.x + cuda.gridDim.x * cuda.blockIdx.z
        h = xz % cuda.gridDim.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane >> 2
        tig = lane & 3
        hq0 = h * G
        tqb0 = (cuda.gridDim.x - 1 - xz // cuda.gridDim.z) * (W * TPM)
        tqb_last = min(tqb0 + W * TPM, T) - 1
        tq0 = tqb0 + warp * TPM
        active = tq0 < T
        tq_last = min(tq0 + TPM, T) - 1
        Lb = pos0 + tqb_last + 1
        nsplit = cuda.gridDim.y
        ppw = ((pos0 + T + P - 1) // P + nsplit - 1) // nsplit
        kb = split * ppw * P
        ke = min(kb + ppw * P, Lb)
        kc = f32(1.0) / gscale[0, h]
        # unallocated pages in the block's range: then every tile is masked per key
        bad = 0
        if ke > kb:
            for p in range(split * ppw + tid, (ke - 1) // P + 1, TH):
                if table[0, h, IX(p)] < 0 or table[1, h, IX(p)] < 0:
                    bad = 1
        holes = cuda.syncthreads_or(bad) != 0
        fastp = P % CHB == 0

        # ---- q as the A operand (positions of the shared rows: 4-bit K in pair order)
        qa = cuda.local.array((NS, 4), np.uint32)
        rpos = cuda.local.array(2, np.int64)
        for hi in range(2):
            r = gid + 8 * hi
            tq = tq0 + r // G
            rpos[hi] = pos0 + min(tq, tq_last)
            ok = active and r < RU and tq < T
            for s in range(NS):
                if K4:
                    d0 = 16 * s + tig
                    d1 = d0 + 4
                else:
                    d0 = 16 * s + 2 * tig
                    d1 = d0 + 1
                x0 = f32(0.0)
                x1 = f32(0.0)
                x2 = f32(0.0)
                x3 = f32(0.0)
                if ok:
                    hq = hq0 + r % G
                    x0 = q[tq, hq, d0] * qscale
                    x1 = q[tq, hq, d1] * qscale
                    x2 = q[tq, hq, d0 + 8] * qscale
                    x3 = q[tq, hq, d1 + 8] * qscale
                qa[s, hi] = pack_k(x0, x1)
                qa[s, 2 + hi] = pack_k(x2, x3)
        acc = cuda.local.array((ND8, 4), np.float32)
        for n in range(ND8):
            for i in range(4):
                acc[n, i] = f32(0.0)
        m0 = _NEG_INF
        m1 = _NEG_INF
        l0 = f32(0.0)
        l1 = f32(0.0)
        sv = cuda.local.array((NKT, 4), np.float32)
        rk = cuda.local.array(NIT, np.int64)
        rv = cuda.local.array(NIT, np.int64)
        okb = cuda.local.array(NIT, np.int32)
        kreg = cuda.local.array((NIT, 2), np.uint32)
        vreg = cuda.local.array((NIT, 2), np.uint32)
        krs = cuda.local.array(NIT, np.float32)
        vrs = cuda.local.array(NIT, np.float32)
        c = tid % NC  # the thread's chunk; its keys key0 + KPI j
        key0 = tid // NC
        if WG:  # 8 consecutive threads: the 8 rows of one core matrix (conflict-free stores)
            c = (tid >> 3) % NC
            key0 = (tid & 7) + 8 * (tid // (8 * NC))
        # a warpgroup's MMAs run when any of its rows sees the tile (the same test in its 4 warps)
        tqg0 = tqb0 + (warp >> 2) * 4 * TPM
        tqg_last = min(tqg0 + 4 * TPM, T) - 1
        run_g = tqg0 < T
        grp = warp >> 2
        pa = cuda.local.array((NVS, 4), np.uint32)
        mm = lane >> 3  # ldmatrix: matrix of this lane's row address, row rr of it
        rr = lane & 7
        kl_off = (8 * (mm >> 1) + rr) * RS
        vl_off = (8 * (mm & 1) + rr) * RS
        mk = mm & 1
        mv = mm >> 1
        # ldmatrix word offsets of the 16-byte chunks 2j + mk (K) / 2j + mv (V), j < 4, of this
        # lane's row after the XOR swizzle; chunk 8q + c' is at 32 q words + the offset of c' (the
        # swizzle only touches the low 3 bits), so every address in the tile loop is one of these
        # plus a constant, which ptxas folds into the instruction.
        koff = cuda.local.array(4, np.uint32)
        voff = cuda.local.array(4, np.uint32)
        for j in range(4):
            koff[j] = u32(kl_off + 4 * ((2 * j + mk) ^ rr))
            voff[j] = u32(vl_off + 4 * ((2 * j + mv) ^ rr))

        ntiles = (ke - kb + CHB - 1) // CHB if ke > kb else 0
        ipg = split * ppw  # fast path: page and offset of the next tile to fetch
        ioff = 0
        if ntiles > 0:  # prologue: tile 0 into buffer 0
            item_rows(table, h, P, fastp, kb, ke, ipg, ioff, key0, rk, rv, okb)
            issue_k(k_words, k_scales, KS, 0, rk, kreg, krs, c, key0, False)
            issue_v(v_words, v_scales, VS, 0, rv, vreg, vrs, c, key0, False)
            commit_k(KS, 0, kreg, c, key0)
            commit_v(VS, 0, vreg, c, key0)
            if c == 0:
                for j in range(NIT):
                    key = key0 + KPI * j
                    kval[key] = okb[j]
                    if kf == INT8:
                        ksr[key] = krs[j]
                    if vf == INT8:
                        vsr[key] = vrs[j]
            ioff += CHB
            if ioff >= P:
                ioff -= P
                ipg += 1
        cp_async_wait_all()
        if WG:
            fence_proxy_async()
        cuda.syncthreads()
        for ti in range(ntiles):
            buf = ti & 1
            k0 = kb + ti * CHB
            nxt = ti + 1 < ntiles
            nb = (buf ^ 1) * BUFW
            if nxt:
                if fastp and not holes and k0 + 2 * CHB <= ke:
                    # the common tile: inside one allocated page and the split, so the rows are
                    # two table entries plus constants (no per-item tests or 64-bit multiplies)
                    rk0 = i64(table[0, h, IX(ipg)]) * P + ioff + key0
                    rv0 = i64(table[1, h, IX(ipg)]) * P + ioff + key0
                    for j in range(NIT):
                        rk[j] = rk0 + KPI * j
                        rv[j] = rv0 + KPI * j
                        okb[j] = 1
                    issue_k(k_words, k_scales, KS, nb, rk, kreg, krs, c, key0, True)
                    issue_v(v_words, v_scales, VS, nb, rv, vreg, vrs, c, key0, True)
                else:
                    item_rows(table, h, P, fastp, k0 + CHB, ke, ipg, ioff, key0, rk, rv, okb)
                    issue_k(k_words, k_scales, KS, nb, rk, kreg, krs, c, key0, False)
                    issue_v(v_words, v_scales, VS, nb, rv, vreg, vrs, c, key0, False)
            run = (run_g and k0 <= pos0 + tqg_last) if WG else (active and k0 <= pos0 + tq_last)
            bk = u32(buf * BUFW)
            # ping-pong (two warpgroups): group 1's S = Q K^T waits for group 0's, group 0's
            # O += P V for group 1's S, so each group's softmax runs under the other's MMAs.
            # Every thread passes each named barrier once a tile, whether its group runs or not.
            if PP and grp == 1:
                bar_sync(1, 256)
            if run:
                if WG:  # ---- S = Q K^T: the warpgroup's 64 rows x CHB keys
                    wg_s(sv, qa, KS, bk)
                else:
                    for u in range(NKT):
                        for i in range(4):
                            sv[u, i] = f32(0.0)
                # ---- S = Q K^T: one ldmatrix.x4 per (pair of 8-key tiles, k16 step)
                for pr in range(0 if WG else NKT // 2):
                    for s in range(NS):
                        b0, b1, b2, b3 = ldsm_x4(KS, bk + koff[s & 3] + u32(16 * pr * RS + 32 * (s >> 2)))
                        u = 2 * pr
                        r0, r1, r2, r3 = mma_k(qa[s, 0], qa[s, 1], qa[s, 2], qa[s, 3], b0, b1,
                                               sv[u, 0], sv[u, 1], sv[u, 2], sv[u, 3])
                        sv[u, 0] = r0
                        sv[u, 1] = r1
                        sv[u, 2] = r2
                        sv[u, 3] = r3
                        r0, r1, r2, r3 = mma_k(qa[s, 0], qa[s, 1], qa[s, 2], qa[s, 3], b2, b3,
                                               sv[u + 1, 0], sv[u + 1, 1], sv[u + 1, 2], sv[u + 1, 3])
                        sv[u + 1, 0] = r0
                        sv[u + 1, 1] = r1
                        sv[u + 1, 2] = r2
                        sv[u + 1, 3] = r3
            if PP:
                bar_arrive(1 + grp, 256)  # group 0: its S is done; group 1: its S is done
            if run:
                # ---- scales and the mask (diagonal / end of the split / holes only)
                # two loops, so that the common tile (no mask) has no per-score branch; bf16
                # keys (scale 1) skip the second one entirely
                if holes or k0 + CHB > ke or k0 + CHB - 1 > pos0 + tq0:
                    for u in range(NKT):
                        for e in range(2):
                            kk = 8 * u + 2 * tig + e
                            sc = key_scale(ksr, buf * CHB + kk, kc)
                            g = k0 + kk
                            okk = g < ke and (not holes or kval[buf * CHB + kk] != 0)
                            sv[u, e] = sv[u, e] * sc if okk and g <= rpos[0] else _NEG_INF
                            sv[u, 2 + e] = sv[u, 2 + e] * sc if okk and g <= rpos[1] else _NEG_INF
                elif K4 or kf == INT8:
                    for u in range(NKT):
                        for e in range(2):
                            sc = key_scale(ksr, buf * CHB + 8 * u + 2 * tig + e, kc)
                            sv[u, e] = sv[u, e] * sc
                            sv[u, 2 + e] = sv[u, 2 + e] * sc
                # ---- online softmax, rows gid (slots 0, 1) and gid + 8 (2, 3)
                mx0 = _NEG_INF
                mx1 = _NEG_INF
                for u in range(NKT):
                    mx0 = max(mx0, max(sv[u, 0], sv[u, 1]))
                    mx1 = max(mx1, max(sv[u, 2], sv[u, 3]))
                mx0 = max(mx0, cuda.shfl_xor_sync(0xFFFFFFFF, mx0, 1))
                mx0 = max(mx0, cuda.shfl_xor_sync(0xFFFFFFFF, mx0, 2))
                mx1 = max(mx1, cuda.shfl_xor_sync(0xFFFFFFFF, mx1, 1))
                mx1 = max(mx1, cuda.shfl_xor_sync(0xFFFFFFFF, mx1, 2))
                if mx0 > m0 + _LAZY:
                    al = ex2(m0 - mx0)
                    m0 = mx0
                    l0 *= al
                    for n in range(ND8):
                        acc[n, 0] *= al
                        acc[n, 1] *= al
                if mx1 > m1 + _LAZY:
                    al = ex2(m1 - mx1)
                    m1 = mx1
                    l1 *= al
                    for n in range(ND8):
                        acc[n, 2] *= al
                        acc[n, 3] *= al
                # a row with nothing unmasked yet keeps m = -inf: subtract 0 there, so a masked
                # score gives ex2(-inf) = 0 without a test per score
                ms0 = m0 if m0 > _NEG_INF else f32(0.0)
                ms1 = m1 if m1 > _NEG_INF else f32(0.0)
                for u in range(NKT):
                    for i in range(4):
                        x = sv[u, i]
                        pr_ = ex2(x - (ms0 if i < 2 else ms1))
                        if i < 2:
                            l0 += pr_
                        else:
                            l1 += pr_
                        sv[u, i] = pr_
                # ---- O += P V: A = P (16-key step v), B = V by ldmatrix.trans, two 8-dim tiles
                bv = u32(buf * BUFW)
                for v in range(NVS):
                    p0 = sv[2 * v, 0]
                    p1 = sv[2 * v, 1]
                    p2 = sv[2 * v, 2]
                    p3 = sv[2 * v, 3]
                    p4 = sv[2 * v + 1, 0]
                    p5 = sv[2 * v + 1, 1]
                    p6 = sv[2 * v + 1, 2]
                    p7 = sv[2 * v + 1, 3]
                    if vf == INT8:
                        kv0 = buf * CHB + 16 * v + 2 * tig
                        s0 = vsr[kv0]
                        s1 = vsr[kv0 + 1]
                        s8 = vsr[kv0 + 8]
                        s9 = vsr[kv0 + 9]
                        a0 = pack_v(p0 * s0, p1 * s1)
                        a1 = pack_v(p2 * s0, p3 * s1)
                        a2 = pack_v(p4 * s8, p5 * s9)
                        a3 = pack_v(p6 * s8, p7 * s9)
                    else:
                        a0 = pack_v(p0, p1)  # row gid, keys 16 v + 2 tig, + 1
                        a1 = pack_v(p2, p3)  # row gid + 8
                        a2 = pack_v(p4, p5)  # row gid, keys + 8
                        a3 = pack_v(p6, p7)
                    if WG:
                        pa[v, 0] = a0
                        pa[v, 1] = a1
                        pa[v, 2] = a2
                        pa[v, 3] = a3
                    for npr in range(0 if WG else ND8 // 2):
                        b0, b1, b2, b3 = ldsm_x4_t(VS, bv + voff[npr & 3] + u32(16 * v * RS + 32 * (npr >> 2)))
                        n = 2 * npr
                        r0, r1, r2, r3 = mma_v(a0, a1, a2, a3, b0, b1, acc[n, 0], acc[n, 1], acc[n, 2], acc[n, 3])
                        acc[n, 0] = r0
                        acc[n, 1] = r1
                        acc[n, 2] = r2
                        acc[n, 3] = r3
                        r0, r1, r2, r3 = mma_v(a0, a1, a2, a3, b2, b3, acc[n + 1, 0], acc[n + 1, 1], acc[n + 1, 2],
                                               acc[n + 1, 3])
                        acc[n + 1, 0] = r0
                        acc[n + 1, 1] = r1
                        acc[n + 1, 2] = r2
                        acc[n + 1, 3] = r3
            if PP and grp == 0:
                bar_sync(2, 256)
            if run and WG:  # ---- O += P V: the warpgroup's 64 rows x D, P from registers
                wg_pv(acc, pa, VS, bk)
            if nxt:
                commit_k(KS, nb, kreg, c, key0)
                commit_v(VS, nb, vreg, c, key0)
                if c == 0 and (holes or kf == INT8 or vf == INT8):  # kval is read in blocks with holes only
                    ob = (buf ^ 1) * CHB
                    for j in range(NIT):
                        key = key0 + KPI * j
                        if holes:
                            kval[ob + key] = okb[j]
                        if kf == INT8:
                            ksr[ob + key] = krs[j]
                        if vf == INT8:
                            vsr[ob + key] = vrs[j]
                ioff += CHB
                if ioff >= P:
                    ioff -= P
                    ipg += 1
            cp_async_wait_all()
            if WG:
                fence_proxy_async()
            cuda.syncthreads()

        # ---- the warp's partials
        if active:
            vc = f32(1.0)
            if V4:
                vc = f32(1.0) / gscale[1, h]
            l0 += cuda.shfl_xor_sync(0xFFFFFFFF, l0, 1)
            l0 += cuda.shfl_xor_sync(0xFFFFFFFF, l0, 2)
            l1 += cuda.shfl_xor_sync(0xFFFFFFFF, l1, 1)
            l1 += cuda.shfl_xor_sync(0xFFFFFFFF, l1, 2)
            # one split: every row saw all its keys (at least its own), so the block writes the
            # normalized output itself (ws_acc is then out viewed as [1, T, Hq, D]) and no reduce
            # runs; (acc * vc) / l is what the reduce computes for one split (weight exp2(0) = 1)
            final = nsplit == 1
            for hi in range(2):
                r = gid + 8 * hi
                tq = tq0 + r // G
                if r < RU and tq < T:
                    hq = hq0 + r % G
                    lr = l0 if hi == 0 else l1
                    if tig == 0 and not final:
                        ws_ml[split, tq, hq, 0] = m0 if hi == 0 else m1
                        ws_ml[split, tq, hq, 1] = lr
                    for n in range(ND8):
                        if V4:
                            dm = 8 * n + tig
                            dm1 = dm + 4
                        else:
                            dm = 8 * n + 2 * tig
                            dm1 = dm + 1
                        o0 = acc[n, 2 * hi] * vc
                        o1 = acc[n, 2 * hi + 1] * vc
                        if final:
                            o0 = o0 / lr
                            o1 = o1 / lr
                        ws_acc[split, tq, hq, dm] = o0
                        ws_acc[split, tq, hq, dm1] = o1

    return attn_mma_fa


def _build_predecode(fmt: int, D: int, devpos: bool):
    """Decode one 4-bit plane of a layer's pages, keys 0..pos0 + T - 1 of every kv head, into the
    fa kernel's 16-bit shared-row form (`_build_prefill_fa`, pre=...): out row r (the pool row, so
    the block table still applies) = D / 2 uint32 words, 8-dim chunk c at words 4c..4c+3 in the
    decoder's pair order, times the E4M3 group scale, by the same instructions as the kernel's
    own per-block decode. One thread per (kv head, key, chunk); the grid covers `L_plan` keys
    per head (a device-position launch: the cache's capacity); threads past pos0 + T or on an
    unallocated page do nothing."""
    NC, RW, SW, RS = D // 8, D // _VPW[fmt], D // 64, D // 2
    dec8 = dec8_iso3 if fmt == ISO3 else dec8_e2m1
    read_pos = _pos_dev if devpos else _pos_int
    IX = np.uint64

    @cuda.jit
    def predecode(pos, T, L_plan, P, words, scales, table, plane, out):
        i = cuda.grid(1)
        c = i % NC
        rest = i // NC
        key = rest % L_plan
        h = rest // L_plan
        if h >= table.shape[1] or key >= read_pos(pos) + T:
            return
        e = table[plane, h, key // P]
        if e < 0:
            return
        r = np.int64(e) * P + key % P
        x = words[IX(r * RW + c)]
        sw = scales[IX(r * SW + (c >> 3))]
        bsh = np.uint32((c >> 1) & 3)
        sp = e4m3x2(sw, sw, bsh | (bsh << 4))
        z0, z1, z2, z3 = dec8(x)
        o = IX(r * RS + 4 * c)
        out[o] = mul_f16x2(z0, sp)
        out[o + IX(1)] = mul_f16x2(z1, sp)
        out[o + IX(2)] = mul_f16x2(z2, sp)
        out[o + IX(3)] = mul_f16x2(z3, sp)

    return predecode


_PREDECODE: dict = {}
PREDECODE_THREADS = 256


def launch_predecode(fmt: int, D: int, pos0, T: int, L_plan: int, P: int, words, scales, table, plane: int,
                     out, stream=0) -> None:
    """Enqueue `_build_predecode`'s kernel for plane (0 K, 1 V) of a layer into `out` (flat uint32,
    >= pool rows x D / 2). pos0: an int, or the int32 device array whose [0] is the position."""
    devpos = not isinstance(pos0, (int, np.integer))
    key = (int(fmt), int(D), devpos)
    if key not in _PREDECODE:
        _PREDECODE[key] = _build_predecode(*key)
    n = table.shape[1] * L_plan * (D // 8)
    _PREDECODE[key][-(-n // PREDECODE_THREADS), PREDECODE_THREADS, stream](pos0, T, L_plan, P, words, scales,
                                                                           table, plane, out)


def prefill_tokens_per_block(G: int, mt: int = 1) -> int:
    return NWARPS * mt * (16 // G)


_PREFILL: dict = {}


def get_prefill_kernel(kf: int, vf: int, G: int, D: int, devpos: bool = False, mt: int = 1, max_registers=None,
                       smem: bool = False, warps: int = 4, chb: int = 0, pre: tuple = (False, False),
                       pingpong: bool = False):
    """The prefill kernel: `_build_prefill` (per-warp decode, `mt` m-tiles a warp) or, smem=True,
    `_build_prefill_smem` (decode shared by the `warps` warps of a block, chunks of `chb` keys), or
    smem="fa" `_build_prefill_fa` (FA2-style, pipelined shared K/V tiles), or smem="wg" the same on
    warpgroup MMAs (sm_90a; launched with `wg_smem_bytes(D, chb)` of dynamic shared memory after
    `wg_prepare`). The "smem", "fa" and "wg" kernels have the same launch (grid, 32 `warps`
    threads). pre: "fa"/"wg" with pre-decoded 4-bit K / V planes (`launch_predecode`)."""
    if smem not in ("fa", "wg"):
        smem = bool(smem)
    fa = smem in ("fa", "wg")
    if fa:
        mt = 1
    pre = (bool(pre[0]), bool(pre[1])) if fa else (False, False)
    pingpong = bool(pingpong) and smem == "wg"
    key = (int(kf), int(vf), int(G), int(D), bool(devpos), int(mt), max_registers, smem, int(warps), int(chb), pre,
           pingpong)
    if key not in _PREFILL:
        if not supports(kf, vf, G, D):
            raise ValueError(f"attention_prefill: unsupported K={kf} V={vf} G={G} D={D}")
        if fa:
            _PREFILL[key] = _build_prefill_fa(kf, vf, G, D, devpos, warps, max_registers, pre, smem == "wg", chb,
                                              pingpong)
        elif smem:
            _PREFILL[key] = _build_prefill_smem(kf, vf, G, D, devpos, warps, chb, max_registers)
        else:
            _PREFILL[key] = _build_prefill(kf, vf, G, D, devpos, mt, max_registers)
    return _PREFILL[key]


def wg_smem_bytes(D: int, chb: int = 0) -> int:
    """Dynamic shared memory of the "wg" kernel: K and V tiles of chb keys, two buffers each."""
    return 8 * (chb or 8192 // D) * D


_WG_READY: set = set()


def wg_prepare(kern, sig: str, nbytes: int) -> None:
    """Let the "wg" kernel compiled for `sig` (`kernel_sig`, the types of its launches) have
    `nbytes` of dynamic shared memory, above the 48 KB a launch may ask for by default."""
    from numba import config

    key = (id(kern), sig, nbytes)
    if config.ENABLE_CUDASIM or key in _WG_READY:
        return
    from numba.cuda.cudadrv.driver import binding, driver

    fn = kern.compile(sig)._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, fn.handle, fn.device.id)
    _WG_READY.add(key)


def _ptx_signatures():
    fm = [BF16, INT8, NVFP4, ISO3]
    out = []
    out += [(get_prefill_kernel(f, f, 2, 128), kernel_sig(f, f)) for f in fm]
    out += [(get_prefill_kernel(NVFP4, ISO3, 4, 128), kernel_sig(NVFP4, ISO3)),
            (get_prefill_kernel(INT8, NVFP4, 6, 256), kernel_sig(INT8, NVFP4)),
            (get_prefill_kernel(BF16, INT8, 1, 64), kernel_sig(BF16, INT8)),
            (get_prefill_kernel(ISO3, BF16, 8, 128, True), kernel_sig(ISO3, BF16, True)),
            (get_prefill_kernel(NVFP4, NVFP4, 2, 128, mt=2), kernel_sig(NVFP4, NVFP4))]
    out += [(get_prefill_kernel(f, f, 2, 128, smem=True), kernel_sig(f, f)) for f in fm]
    out += [(get_prefill_kernel(NVFP4, ISO3, 4, 128, smem=True), kernel_sig(NVFP4, ISO3)),
            (get_prefill_kernel(INT8, NVFP4, 6, 256, smem=True), kernel_sig(INT8, NVFP4)),
            (get_prefill_kernel(BF16, INT8, 1, 64, smem=True), kernel_sig(BF16, INT8)),
            (get_prefill_kernel(ISO3, BF16, 8, 128, True, smem=True), kernel_sig(ISO3, BF16, True)),
            (get_prefill_kernel(NVFP4, NVFP4, 2, 128, smem=True, warps=8), kernel_sig(NVFP4, NVFP4))]
    out += [(get_prefill_kernel(f, f, 2, 128, smem="fa"), kernel_sig(f, f)) for f in fm]
    out += [(get_prefill_kernel(NVFP4, ISO3, 4, 128, smem="fa"), kernel_sig(NVFP4, ISO3)),
            (get_prefill_kernel(INT8, NVFP4, 6, 256, smem="fa"), kernel_sig(INT8, NVFP4)),
            (get_prefill_kernel(BF16, INT8, 1, 64, smem="fa"), kernel_sig(BF16, INT8)),
            (get_prefill_kernel(ISO3, BF16, 8, 128, True, smem="fa"), kernel_sig(ISO3, BF16, True)),
            (get_prefill_kernel(NVFP4, NVFP4, 2, 128, smem="fa", warps=8), kernel_sig(NVFP4, NVFP4)),
            (get_prefill_kernel(BF16, BF16, 4, 128, smem="fa", warps=8), kernel_sig(BF16, BF16)),
            (get_prefill_kernel(NVFP4, ISO3, 2, 128, True, smem="fa", pre=(True, True)), kernel_sig(NVFP4, ISO3, True)),
            (get_prefill_kernel(INT8, NVFP4, 4, 64, smem="fa", pre=(False, True)), kernel_sig(INT8, NVFP4))]
    out += [(get_prefill_kernel(f, f, 2, 128, smem="wg"), kernel_sig(f, f)) for f in fm]  # wgmma: sm_90a
    out += [(get_prefill_kernel(NVFP4, NVFP4, 2, 128, True, smem="wg", pre=(True, True)), kernel_sig(NVFP4, NVFP4, True)),
            (get_prefill_kernel(BF16, BF16, 2, 128, True, smem="wg", warps=8), kernel_sig(BF16, BF16, True)),
            (get_prefill_kernel(INT8, NVFP4, 4, 64, smem="wg"), kernel_sig(INT8, NVFP4))]
    for fmt in (NVFP4, ISO3):
        for devpos in (False, True):
            out.append((_build_predecode(fmt, 128, devpos),
                        f"void({'int32[::1]' if devpos else 'int64'}, int64, int64, int64, uint32[::1], uint32[::1], "
                        "int32[:,:,::1], int64, uint32[::1])"))
    return out


PTX_SIGNATURES = _ptx_signatures()
