"""Tensor-core chunked-prefill attention over the paged, mixed-format KV cache (GPU; emulated
under the simulator).

The decode kernel (attention_mma.py) gives each warp one query token, so a chunk of T tokens
decodes every visible page T times and fills only G of the 16 MMA rows. Here a warp's 16 rows
are (query token, q head) pairs, 16 // G tokens per m-tile, with the causal mask per row, and the
warps of a block share double-buffered K/V tiles in shared memory, FlashAttention-2 style ("fa",
mma.sync), or on Hopper's warpgroup MMAs ("wg", wgmma, sm_90a). Same operand decoding, scale
handling, online softmax, split plan and workspace as the decode kernel; docs/kernels.md has the
layouts and what was measured. (The per-warp "rows" and block-shared "smem" variants lost to "fa"
at every measured context and were removed in session 13; docs/kernels_log.md keeps their history.)
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from coldkv.numba_kernels.jit_cache import cuda_kernel
from coldkv.numba_kernels.attention_cuda import TO16_FP16, _pos_dev, _pos_int
from coldkv.numba_kernels.attention_mma import _LAZY, _NEG_INF, _VPW, NWARPS, kernel_sig, supports
from coldkv.numba_kernels.fp import bf16_enc, f16_enc
from coldkv.numba_kernels.mma_ptx import (
    SIMULATED, cp_async16_zfill, cp_async_commit, cp_async_wait, cp_async_wait_all, dec4_e2m1, dec8_iso3, dec_i8,
    e4m3x2, ex2, ldg4, ldsm_x4, ldsm_x4_t, mma_bf16, mma_f16, mul_f16x2, pack_bf16, pack_f16, sts4)
from coldkv.numba_kernels.quant import BF16, INT8, ISO3, NVFP4
from coldkv.numba_kernels.wgmma_ptx import (bar_arrive, bar_sync, fence_proxy_async, no_wgmma, reg_fence, setmaxnreg, wgmma,
                                             wgmma_wait, wgmma_wait_acc)

WS_STAGES = 4  # the warp-specialized kernel's ring of K / V tiles (160 KB with Q at d 128)
# its registers a thread: 168 at launch (one block of 384 threads an SM), then the producer gives
# some to the consumers (128 x producer + 256 x consumer <= 65536)
WS_REGS_PRODUCER, WS_REGS_CONSUMER = 136, 184


@cuda.jit(device=True, inline=True)
def no_wgmma_wait(acc, a):
    """What a build without an asynchronous O += P V calls in place of wgmma_wait (nothing)."""
    return


@cuda.jit(device=True, inline=True)
def no_reg_fence(acc):
    """What a build without S ahead calls in place of reg_fence (nothing)."""
    return


@cuda.jit(device=True, inline=True)
def no_wgmma_wait3(acc, a, sacc):
    """What a build without the warp-specialized consumers calls in place of their wgmma_wait
    (nothing)."""
    return


def _build_prefill_fa(kf: int, vf: int, G: int, D: int, devpos: bool, W: int = 4, max_registers=None,
                      pre: tuple = (False, False), wg: bool = False, chb: int = 0, pingpong: bool = False,
                      pv_async: bool = False, ws: bool = False, depth: int = 2):
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
    8][8 keys][16 bytes], `soff`), the layout wgmma reads without swizzle, and live in dynamic
    shared memory (`wg_smem_bytes`: 64 KB at CHB 64, d 128; the launcher raises the kernel's
    limit). pv_async (wg): O += P V is committed and not waited for until the next tile starts
    (before its loads overwrite the V buffer the MMA reads), so it runs under the next tile's
    decode into shared memory and the tile barrier. (Two schedules of these kernels were measured
    and dropped in session 45's clean-up; git has them at aa6ad1a: the two warpgroups taking turns
    through named barriers, "wg8pp", no faster; and S of the next tile issued under this tile's
    softmax with Q in shared memory, "wg8s", auto's for 4-bit planes until the warp-specialized
    kernel beat it.) chb: keys per tile (default 4096 / D, wg 8192 / D, also its maximum: 128-key
    tiles at d 128 gave wrong outputs on the H200 at cbac499 and 5f25e53, while their simulator
    case passed).

    ws (wg, W 8, planes not pre-decoded): warp-specialized (FA3's producer / consumer split;
    `attn_ws`). A fifth warpgroup loads and decodes the tiles into a ring of WS_STAGES buffers
    while the two consumer warpgroups only multiply and run the softmax, so no warp waits at a
    block-wide barrier and the decode runs under the MMAs. Buffers are handed over by named
    barriers: FULL(b) (the producer arrives, the consumers sync) and EMPTY(b) (the other way).
    A bf16 plane's rows go by cp.async straight into the buffer, so with one the producer waits
    at EMPTY before it issues a tile's loads (not before it decodes them) and hands tile t over
    before it issues tile t + depth - 1 (session 40; auto's for bf16 K and V since session 41).
    Each consumer issues S of tile i + 1 together with O += P V of tile i and runs tile i + 1's
    softmax while that O += P V runs (FA3's in-warpgroup overlap); S keeps one accumulator, since
    tile i's P is packed before the next S is issued. Q stays in the consumers' registers and S
    reads it from there (the RS-form wgmma; from shared memory, the SS form, it read twice the
    shared-memory bytes: "wg8wss" until session 45). With K and V both 4-bit or both int8 the
    producer loads 16 bytes of codes a row at a time (4 chunks an item, or 2 of int8; 4 bytes
    until session 45: "wg8wn"). depth (ws): tiles whose loads a producer thread has in flight (2
    or 3, a slot of registers each; 4 was no faster with 4-bit planes, session 39, and slower with
    bf16 ones, session 41). pingpong (ws): each consumer warpgroup has its own FULL barriers, and
    the two take turns issuing their MMAs through two more named barriers, so one's softmax runs
    under the other's MMAs (FA3's inter-warpgroup schedule; session 44)."""
    if (pre[0] and kf not in (NVFP4, ISO3)) or (pre[1] and vf not in (NVFP4, ISO3)):
        raise ValueError("attention_prefill: only nvfp4/iso3 planes come pre-decoded")
    if wg and (D > 128 or W % 4):
        raise ValueError("attention_prefill: the wgmma kernel needs head_dim <= 128 and whole warpgroups")
    if ws and (not wg or W != 8 or pre[0] or pre[1]):
        raise ValueError("attention_prefill: the warp-specialized kernel is wg with 8 consumer warps, "
                         "planes not pre-decoded")
    if depth not in (2, 3) or (depth != 2 and not ws):
        raise ValueError("attention_prefill: the producer has 2 or 3 tiles of loads in flight (ws only)")
    if pingpong and not ws:
        raise ValueError("attention_prefill: the consumers take turns in the warp-specialized kernel only")
    if wg and chb * D > 8192:  # 128-key tiles at d 128 passed the simulator but were wrong on the H200
        raise ValueError("attention_prefill: the wgmma kernel's tiles are at most 8192 / head_dim keys")
    NS = D // 16
    NC = D // 8  # 16-byte chunks (8 dims) of a shared row
    RS = D // 2  # u32 words of a shared row
    CHB = tile_keys(D, wg, chb)
    NKT = CHB // 8
    NVS = CHB // 16
    ND8 = D // 8
    TPM = 16 // G
    RU = TPM * G
    WS = ws
    TH = 128 if WS else 32 * W  # threads that load tiles (WS: the producer warpgroup)
    TH_ALL = 32 * W + (128 if WS else 0)  # the block
    K4, V4 = kf in (NVFP4, ISO3), vf in (NVFP4, ISO3)
    # chunks an item: the WS producer of 4-bit planes loads 16 bytes of codes (4 chunks) a row at a
    # time (ld.global.v4), a quarter of the loads, their addresses and registers in flight; of int8
    # planes, 2 chunks (their row scales are one a key)
    I8 = kf == INT8 and vf == INT8
    IC = (4 if K4 and V4 else 2 if I8 else 1) if WS else 1
    NIT = CHB * NC // (TH * IC)  # load items (key, IC chunks) per thread per plane and tile
    KPI = TH * IC // NC  # key stride between a thread's items
    CW = 2 * IC if I8 else IC + 1  # registers an item: its code words (int8: 2 a chunk), then (4-bit) the scale word
    NIR = NC // IC  # items a row
    NF = depth  # WS producer: tiles of loads in flight
    # WS with a bf16 plane: its loads are cp.async into the tile's buffer (a group a tile)
    COPY = WS and BF16 in (kf, vf)
    copies_landed = cp_async_wait[max(NF - 2, 0)]  # (COPY) the oldest of NF - 1 groups has landed
    BUFW = CHB * RS
    # WS with pingpong: each consumer warpgroup waits for a tile at its own FULL barrier (with one
    # shared, both met there every tile and ran their softmax at the same time), and the two take
    # turns issuing their MMAs, so one's softmax runs under the other's (FA3's schedule)
    PPW = ws and pingpong
    # named barrier ids (16 a block, 0 is syncthreads'): FULL(b[, g]), EMPTY(b), the turns
    FULL_CNT = 256 if PPW else TH_ALL  # the producer's 128 arrive, a consumer warpgroup's (or both) sync
    EMPTY0 = 1 + (2 if PPW else 1) * WS_STAGES
    TURN0 = EMPTY0 + WS_STAGES
    NBUF = WS_STAGES if WS else 2  # tile buffers: computing, loading
    SBW, SCH = NBUF * BUFW, NBUF * CHB  # shared array sizes (literal shapes)
    SIM = SIMULATED
    RWK, RWV = D // _VPW[BF16 if pre[0] else kf], D // _VPW[BF16 if pre[1] else vf]
    SW = D // 64
    # E2M1 tiles hold value * scale * 2^-14 (mma_ptx.dec4_e2m1, exact): undone on the fp32 scores
    # and outputs with the global scales (a power of two: the fp32 sums scale exactly, short of
    # underflow)
    KSC = np.float32(2.0**14 if kf == NVFP4 else 1.0)
    VSC = np.float32(2.0**14 if vf == NVFP4 else 1.0)
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
    PVA = wg and (pv_async or WS)
    wg_s = wg_pv = wg_s_rs = no_wgmma
    wg_pv_wait = no_wgmma_wait
    wg_sa_wait = no_wgmma_wait3
    o_fence = s_retire = no_reg_fence
    regs_give = setmaxnreg(WS_REGS_PRODUCER, False) if WS else None
    regs_take = setmaxnreg(WS_REGS_CONSUMER, True) if WS else None
    if WG:  # K-major K: LBO the next dim core, SBO the next key core; V N-major: the other way
        wg_s = wgmma(CHB, NS, kf == BF16, False, False, 128, NC * 128, 256)
        wg_pv = wgmma(D, NVS, vf == BF16, True, True, NC * 128, 128, 2 * NC * 128, wait=not PVA)
        if PVA:
            wg_pv_wait = wgmma_wait(D, NVS)
        if WS:  # S issued with the last tile's O += P V and retired apart (the consumers' overlap)
            wg_s_rs = wgmma(CHB, NS, kf == BF16, False, False, 128, NC * 128, 256, wait=False)
            wg_sa_wait = wgmma_wait(D, NVS, CHB)
            o_fence = reg_fence(D)
            s_retire = wgmma_wait_acc(CHB, 1)

    @cuda.jit(device=True, inline=True)
    def soff(key, c):
        """Word offset of (key, 16-byte chunk c) in a tile: core matrices for wgmma, else rows
        with the chunks XOR-swizzled by key & 7 (conflict-free ldmatrix)."""
        if WG:
            return ((key >> 3) * NC + c) * 32 + (key & 7) * 4
        return key * RS + 4 * (c ^ (key & 7))

    @cuda.jit(device=True, inline=True)
    def tile_barrier():
        """The next tile has landed (cp.async) and, for wgmma, is visible to the async proxy."""
        cp_async_wait_all()
        if WG:
            fence_proxy_async()
        cuda.syncthreads()

    @cuda.jit(device=True)
    def key_scale(ksr, i):
        """What a score of shared key i is multiplied by before the softmax: an int8 row scale, or
        1 (bf16; 4-bit keys: their plane's kc is applied in the softmax)."""
        if kf == INT8:
            return ksr[i]
        return f32(1.0)

    def plane_ops(fmt, RW, pre_decoded):
        dec8 = dec8_iso3 if fmt == ISO3 else dec4_e2m1
        copy = fmt == BF16 or pre_decoded  # 16-bit rows: straight into shared memory

        @cuda.jit(device=True, inline=True)
        def issue(words, scales, sarr, base, rows, creg, crs, c, key0, allok):
            """Start bringing items j (key key0 + KPI j, chunks c .. c + IC - 1; rows[j] < 0:
            invalid) of the next tile in: bf16 by cp.async into sarr, the others into registers
            (4-bit: creg[j, :IC] the code words, creg[j, IC] the scale word). allok (a constant):
            every row is valid, so no per-item test is compiled."""
            for j in range(NIT):
                r = rows[j]
                ok = allok or r >= 0
                rr = r if ok else i64(0)
                key = key0 + KPI * j
                if copy:
                    cp_async16_zfill(sarr, base + soff(key, c), words, IX(rr * RW + 4 * c),
                               16 if ok else 0)
                elif IC > 1:  # 16 bytes: int8 chunks c, c + 1 (c even), 4-bit c .. c + 3 (c a multiple of 4)
                    x0, x1, x2, x3 = ldg4(words, IX(rr * RW + (2 * c if fmt == INT8 else c)))
                    creg[j, 0] = x0 if ok else u32(0)
                    creg[j, 1] = x1 if ok else u32(0)
                    creg[j, 2] = x2 if ok else u32(0)
                    creg[j, 3] = x3 if ok else u32(0)
                    if fmt == INT8:  # the key's row scale
                        sc = scales[IX(rr)]
                        crs[j] = sc if ok else f32(0.0)
                    else:  # the scale word the 4 chunks share
                        sw = scales[IX(rr * SW + (c >> 3))]
                        creg[j, 4] = sw if ok else u32(0)
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
                    if fmt == INT8 and IC == 2:
                        for i in range(IC):
                            x0 = creg[j, 2 * i] ^ u32(0x80808080)
                            x1 = creg[j, 2 * i + 1] ^ u32(0x80808080)
                            sts4(sarr, base + soff(key, c + i), dec_i8(x0, 0x5140), dec_i8(x0, 0x7362),
                                 dec_i8(x1, 0x5140), dec_i8(x1, 0x7362))
                    elif fmt == INT8:
                        x0 = creg[j, 0] ^ u32(0x80808080)
                        x1 = creg[j, 1] ^ u32(0x80808080)
                        sts4(sarr, base + soff(key, c), dec_i8(x0, 0x5140), dec_i8(x0, 0x7362),
                             dec_i8(x1, 0x5140), dec_i8(x1, 0x7362))
                    elif IC == 1:  # (a loop of one compiles to other SASS than the GPU-tested builds')
                        bsh = u32((c >> 1) & 3)  # the chunk's E4M3 scale byte
                        sp = e4m3x2(creg[j, 1], creg[j, 1], bsh | (bsh << 4))
                        z0, z1, z2, z3 = dec8(creg[j, 0])
                        sts4(sarr, base + soff(key, c), mul_f16x2(z0, sp), mul_f16x2(z1, sp), mul_f16x2(z2, sp),
                             mul_f16x2(z3, sp))
                    else:
                        sw = creg[j, IC]
                        sp = u32(0)
                        for i in range(IC):
                            if i % 2 == 0:  # the chunk's E4M3 scale byte (chunks 2m, 2m + 1 share it)
                                bsh = u32(((c + i) >> 1) & 3)
                                sp = e4m3x2(sw, sw, bsh | (bsh << 4))
                            z0, z1, z2, z3 = dec8(creg[j, i])
                            sts4(sarr, base + soff(key, c + i), mul_f16x2(z0, sp), mul_f16x2(z1, sp),
                                 mul_f16x2(z2, sp), mul_f16x2(z3, sp))

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

    @cuda.jit(device=True, inline=True)
    def put_tile(b, KS, VS, ksr, vsr, kval, key0, c, okb, kreg, vreg, krs, vrs):
        """Decode the registers of issue_k / issue_v into buffer b, with the keys' valid flags and
        int8 row scales."""
        commit_k(KS, b * BUFW, kreg, c, key0)
        commit_v(VS, b * BUFW, vreg, c, key0)
        if c == 0:
            for j in range(NIT):
                key = b * CHB + key0 + KPI * j
                kval[key] = okb[j]
                if kf == INT8:
                    ksr[key] = krs[j]
                if vf == INT8:
                    vsr[key] = vrs[j]

    @cuda.jit(device=True, inline=True)
    def split_range(table, h, P, pos0, T, Lb, split, nsplit, tid, nth):
        """The block's keys [kb, ke) (its split's pages, up to its last query row's position Lb)
        and whether any of those pages is unallocated (then every tile is masked per key; a
        block-wide vote of its nth threads). -> pages a split, kb, ke, holes"""
        ppw = ((pos0 + T + P - 1) // P + nsplit - 1) // nsplit
        kb = split * ppw * P
        ke = min(kb + ppw * P, Lb)
        bad = 0
        if ke > kb:
            for p in range(split * ppw + tid, (ke - 1) // P + 1, nth):
                if table[0, h, IX(p)] < 0 or table[1, h, IX(p)] < 0:
                    bad = 1
        return ppw, kb, ke, cuda.syncthreads_or(bad) != 0

    @cuda.jit(device=True, inline=True)
    def load_q(q, qscale, pos0, tq0, tq_last, T, active, hq0, gid, tig, rpos, qa):
        """This lane's q fragments (positions of the shared rows: 4-bit K in pair order) into
        registers (qa, the A operand); rpos: the rows' positions."""
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

    @cuda.jit(device=True, inline=True)
    def scale_mask(sv, ksr, kval, bo, k0, ke, holes, tig, rpos, masked):
        """The tile's scores (shared key slots bo..): int8 keys times their row scales, and -inf
        where masked (past the split's end ke, a hole, past the row's position). Two loops, so that
        the common tile (masked False) has no per-score branch; bf16 keys (scale 1) and 4-bit keys
        (one scale kc for the plane, applied to the row maxima and in the exponent's FFMA) skip the
        second one entirely."""
        if masked:
            for u in range(NKT):
                for e in range(2):
                    kk = 8 * u + 2 * tig + e
                    sc = key_scale(ksr, bo + kk)
                    g = k0 + kk
                    okk = g < ke and (not holes or kval[bo + kk] != 0)
                    sv[u, e] = sv[u, e] * sc if okk and g <= rpos[0] else _NEG_INF
                    sv[u, 2 + e] = sv[u, 2 + e] * sc if okk and g <= rpos[1] else _NEG_INF
        elif kf == INT8:
            for u in range(NKT):
                for e in range(2):
                    sc = key_scale(ksr, bo + 8 * u + 2 * tig + e)
                    sv[u, e] = sv[u, e] * sc
                    sv[u, 2 + e] = sv[u, 2 + e] * sc

    @cuda.jit(device=True, inline=True)
    def row_max(sv, kc):
        """The tile's maxima of rows gid (slots 0, 1) and gid + 8 (2, 3), in m's units (4-bit keys:
        the scores are q . (value x E4M3 scale), times kc)."""
        mx0 = _NEG_INF
        mx1 = _NEG_INF
        for u in range(NKT):
            mx0 = max(mx0, max(sv[u, 0], sv[u, 1]))
            mx1 = max(mx1, max(sv[u, 2], sv[u, 3]))
        mx0 = max(mx0, cuda.shfl_xor_sync(0xFFFFFFFF, mx0, 1))
        mx0 = max(mx0, cuda.shfl_xor_sync(0xFFFFFFFF, mx0, 2))
        mx1 = max(mx1, cuda.shfl_xor_sync(0xFFFFFFFF, mx1, 1))
        mx1 = max(mx1, cuda.shfl_xor_sync(0xFFFFFFFF, mx1, 2))
        if K4:
            mx0 *= kc
            mx1 *= kc
        return mx0, mx1

    @cuda.jit(device=True, inline=True)
    def online_max(m0, m1, l0, l1, mx0, mx1):
        """The lazy max update without a branch: -> m0, m1, l0, l1 and al0, al1, what O's rows
        are to be multiplied by (1 when the max stays)."""
        up0 = mx0 > m0 + _LAZY
        up1 = mx1 > m1 + _LAZY
        al0 = ex2(m0 - mx0) if up0 else f32(1.0)
        al1 = ex2(m1 - mx1) if up1 else f32(1.0)
        return mx0 if up0 else m0, mx1 if up1 else m1, l0 * al0, l1 * al1, al0, al1

    @cuda.jit(device=True, inline=True)
    def scale_acc(acc, al0, al1):
        for n in range(ND8):
            acc[n, 0] *= al0
            acc[n, 1] *= al0
            acc[n, 2] *= al1
            acc[n, 3] *= al1

    @cuda.jit(device=True, inline=True)
    def lazy_rescale(acc, i0, m, l, mx):
        """`online_max`'s lazy update with a branch, for one row of the lane's two (O's columns
        i0, i0 + 1): only a max that grew by more than _LAZY rescales O and l. -> m, l"""
        if mx > m + _LAZY:
            al = ex2(m - mx)
            m = mx
            l *= al
            for n in range(ND8):
                acc[n, i0] *= al
                acc[n, i0 + 1] *= al
        return m, l

    @cuda.jit(device=True, inline=True)
    def exp_sum(sv, kc, m0, m1, l0, l1):
        """p = 2^(s - m) in place of the scores, and the row sums: -> l0, l1. A row with nothing
        unmasked yet keeps m = -inf: 0 is subtracted there, so a masked score gives ex2(-inf) = 0
        without a test per score."""
        ms0 = m0 if m0 > _NEG_INF else f32(0.0)
        ms1 = m1 if m1 > _NEG_INF else f32(0.0)
        for u in range(NKT):
            for i in range(4):
                x = sv[u, i]
                if K4:  # one FFMA: kc > 0, so ms is kc x the raw scores' max
                    pr_ = ex2(x * kc - (ms0 if i < 2 else ms1))
                else:
                    pr_ = ex2(x - (ms0 if i < 2 else ms1))
                if i < 2:
                    l0 += pr_
                else:
                    l1 += pr_
                sv[u, i] = pr_
        return l0, l1

    @cuda.jit(device=True, inline=True)
    def pack_p(sv, v, vsr, bo, tig):
        """P's A fragment for keys 16 v.. of the tile (16-bit pairs; int8 values: times their row
        scales from shared slots bo..): rows gid / gid + 8, keys 16 v + 2 tig (+ 1), then + 8."""
        p0 = sv[2 * v, 0]
        p1 = sv[2 * v, 1]
        p2 = sv[2 * v, 2]
        p3 = sv[2 * v, 3]
        p4 = sv[2 * v + 1, 0]
        p5 = sv[2 * v + 1, 1]
        p6 = sv[2 * v + 1, 2]
        p7 = sv[2 * v + 1, 3]
        if vf == INT8:
            kv0 = bo + 16 * v + 2 * tig
            s0 = vsr[kv0]
            s1 = vsr[kv0 + 1]
            s8 = vsr[kv0 + 8]
            s9 = vsr[kv0 + 9]
            return pack_v(p0 * s0, p1 * s1), pack_v(p2 * s0, p3 * s1), pack_v(p4 * s8, p5 * s9), pack_v(p6 * s8, p7 * s9)
        return pack_v(p0, p1), pack_v(p2, p3), pack_v(p4, p5), pack_v(p6, p7)

    @cuda.jit(device=True, inline=True)
    def write_rows(active, split, nsplit, tq0, hq0, gid, tig, T, acc, m0, m1, l0, l1, gscale, h, ws_acc, ws_ml,
                   out16, to16):
        """The warp's rows: normalized into out (one split) or partials and (m, l) into the workspace."""
        if active:
            vc = f32(1.0)
            if V4:
                vc = VSC / gscale[1, h]
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
                            if to16:  # o_proj's 16-bit input: round16's values, without its pass
                                out16[tq, hq, dm] = f16_enc(o0) if to16 == TO16_FP16 else bf16_enc(o0)
                                out16[tq, hq, dm1] = f16_enc(o1) if to16 == TO16_FP16 else bf16_enc(o1)
                        ws_acc[split, tq, hq, dm] = o0
                        ws_acc[split, tq, hq, dm1] = o1

    jit = cuda_kernel(max_registers=max_registers)

    @jit
    def attn_mma_fa(q, pos, qscale, P, k_words, k_scales, v_words, v_scales, gscale, table, ws_acc, ws_ml, out16,
                    to16):
        if WG:  # dynamic: [K buffers | V buffers], 64 KB at d 128
            if SIM:  # (the simulator sizes a dynamic array by a dtype instance's itemsize)
                dyn = cuda.shared.array(0, np.dtype(np.uint32))
            else:
                dyn = cuda.shared.array(0, np.uint32, alignment=128)
            KS = dyn[:SBW]
            VS = dyn[SBW:2 * SBW]
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
        kc = KSC / gscale[0, h]
        ppw, kb, ke, holes = split_range(table, h, P, pos0, T, Lb, split, nsplit, tid, TH)
        fastp = P % CHB == 0

        # ---- q as the A operand
        qa = cuda.local.array((NS, 4), np.uint32)
        rpos = cuda.local.array(2, np.int64)
        load_q(q, qscale, pos0, tq0, tq_last, T, active, hq0, gid, tig, rpos, qa)
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
        kreg = cuda.local.array((NIT, CW), np.uint32)
        vreg = cuda.local.array((NIT, CW), np.uint32)
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
        for pt in range(NBUF - 1):  # prologue: tile 0 into buffer 0
            if pt < ntiles:
                item_rows(table, h, P, fastp, kb + pt * CHB, ke, ipg, ioff, key0, rk, rv, okb)
                issue_k(k_words, k_scales, KS, pt * BUFW, rk, kreg, krs, c, key0, False)
                issue_v(v_words, v_scales, VS, pt * BUFW, rv, vreg, vrs, c, key0, False)
                put_tile(pt, KS, VS, ksr, vsr, kval, key0, c, okb, kreg, vreg, krs, vrs)
                ioff += CHB
                if ioff >= P:
                    ioff -= P
                    ipg += 1
        tile_barrier()
        buf = 0  # the tile's buffer
        for ti in range(ntiles):
            if PVA:  # the last tile's O += P V is done before anything reuses its buffer or acc
                wg_pv_wait(acc, pa)
            k0 = kb + ti * CHB
            lt = ti + NBUF - 1  # the tile brought in during this one, into the buffer freed last
            lbuf = buf - 1 if buf > 0 else NBUF - 1
            kl = kb + lt * CHB
            nxt = lt < ntiles
            nb = lbuf * BUFW
            if nxt:
                if fastp and not holes and kl + CHB <= ke:
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
                    item_rows(table, h, P, fastp, kl, ke, ipg, ioff, key0, rk, rv, okb)
                    issue_k(k_words, k_scales, KS, nb, rk, kreg, krs, c, key0, False)
                    issue_v(v_words, v_scales, VS, nb, rv, vreg, vrs, c, key0, False)
            run = (run_g and k0 <= pos0 + tqg_last) if WG else (active and k0 <= pos0 + tq_last)
            bk = u32(buf * BUFW)
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
            if run:
                # ---- scales and the mask (diagonal / end of the split / holes only), row maxima
                scale_mask(sv, ksr, kval, buf * CHB, k0, ke, holes, tig, rpos,
                           holes or k0 + CHB > ke or k0 + CHB - 1 > pos0 + tq0)
                mx0, mx1 = row_max(sv, kc)
                m0, l0 = lazy_rescale(acc, 0, m0, l0, mx0)
                m1, l1 = lazy_rescale(acc, 2, m1, l1, mx1)
                l0, l1 = exp_sum(sv, kc, m0, m1, l0, l1)
                # ---- O += P V: A = P (16-key step v), B = V by ldmatrix.trans, two 8-dim tiles
                bv = u32(buf * BUFW)
                for v in range(NVS):
                    a0, a1, a2, a3 = pack_p(sv, v, vsr, buf * CHB, tig)
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
            if run and WG:  # ---- O += P V: the warpgroup's 64 rows x D, P from registers
                wg_pv(acc, pa, VS, bk)
            if nxt:
                commit_k(KS, nb, kreg, c, key0)
                commit_v(VS, nb, vreg, c, key0)
                if c == 0 and (holes or kf == INT8 or vf == INT8):  # kval is read in blocks with holes only
                    ob = lbuf * CHB
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
            tile_barrier()
            buf = buf + 1 if buf + 1 < NBUF else 0

        if PVA:
            wg_pv_wait(acc, pa)
        # ---- the warp's partials
        write_rows(active, split, nsplit, tq0, hq0, gid, tig, T, acc, m0, m1, l0, l1, gscale, h, ws_acc, ws_ml,
                   out16, to16)

    @cuda.jit(device=True, inline=True)
    def ws_fetch(k_words, k_scales, v_words, v_scales, table, h, P, fastp, holes, kb, ke, key0, c, slot, KS, VS, t):
        """WS producer: the rows of tile t (at key kb + t CHB) and its code words into a slot's
        registers; a bf16 plane's rows by cp.async into the tile's buffer, once the consumers are
        done with it (COPY: the caller commits the group)."""
        rk, rv, okb, kreg, vreg, krs, vrs = slot
        kl = kb + t * CHB
        base = u32(0)
        if COPY:
            b = t % NBUF
            if t >= NBUF:
                bar_sync(EMPTY0 + b, TH_ALL)
            base = u32(b * BUFW)
        if fastp and not holes and kl + CHB <= ke:  # the common tile (as in attn_mma_fa)
            pg = kl // P
            rk0 = i64(table[0, h, IX(pg)]) * P + (kl - pg * P) + key0
            rv0 = i64(table[1, h, IX(pg)]) * P + (kl - pg * P) + key0
            for j in range(NIT):
                rk[j] = rk0 + KPI * j
                rv[j] = rv0 + KPI * j
                okb[j] = 1
            issue_k(k_words, k_scales, KS, base, rk, kreg, krs, c, key0, True)
            issue_v(v_words, v_scales, VS, base, rv, vreg, vrs, c, key0, True)
        else:
            item_rows(table, h, P, fastp, kl, ke, kl // P, kl % P, key0, rk, rv, okb)
            issue_k(k_words, k_scales, KS, base, rk, kreg, krs, c, key0, False)
            issue_v(v_words, v_scales, VS, base, rv, vreg, vrs, c, key0, False)

    @cuda.jit(device=True, inline=True)
    def ws_put(t, KS, VS, ksr, vsr, kval, key0, c, slot):
        """WS producer: wait until the consumers are done with tile t's buffer (its last use was
        tile t - WS_STAGES; COPY: ws_fetch waited, and tile t's cp.async group is waited for here:
        groups t + 1 .. t + NF - 2 may be in flight), decode tile t from a slot's registers into it
        and hand it over."""
        _, _, okb, kreg, vreg, krs, vrs = slot
        b = t % NBUF
        if COPY:
            copies_landed()
        elif t >= NBUF:
            bar_sync(EMPTY0 + b, TH_ALL)
        put_tile(b, KS, VS, ksr, vsr, kval, key0, c, okb, kreg, vreg, krs, vrs)
        fence_proxy_async()  # the generic-proxy stores, before the wgmmas read them
        bar_arrive(1 + b, FULL_CNT)
        if PPW:
            bar_arrive(1 + NBUF + b, FULL_CNT)

    @cuda.jit(device=True, inline=True)
    def ws_slot():
        """A producer thread's registers for one tile's loads in flight (ws_fetch fills them, ws_put
        decodes them): K and V rows, ok flags, code (and scale) words, int8 row scales."""
        return (cuda.local.array(NIT, np.int64), cuda.local.array(NIT, np.int64), cuda.local.array(NIT, np.int32),
                cuda.local.array((NIT, CW), np.uint32), cuda.local.array((NIT, CW), np.uint32),
                cuda.local.array(NIT, np.float32), cuda.local.array(NIT, np.float32))

    @cuda.jit(device=True, inline=True)
    def ws_step(k_words, k_scales, v_words, v_scales, table, h, P, fastp, holes, kb, ke, ntiles, t, KS, VS, ksr,
                vsr, kval, key0, c, ahead, slot, lead):
        """WS producer: the loads of tile t + NF - 1 into slot `ahead`, then tile t from `slot` (lead:
        t is known to be a tile). COPY: tile t first, since tile t + NF - 1's loads wait for the
        consumers to free its buffer, which they do only once tile t has landed (with NF 4); one
        cp.async group a step, empty past the last tile, so tile t is always group t."""
        put = lead or t < ntiles
        if COPY and put:
            ws_put(t, KS, VS, ksr, vsr, kval, key0, c, slot)
        if t + NF - 1 < ntiles:
            ws_fetch(k_words, k_scales, v_words, v_scales, table, h, P, fastp, holes, kb, ke, key0, c, ahead,
                     KS, VS, t + NF - 1)
        if COPY:
            cp_async_commit()
        elif put:
            ws_put(t, KS, VS, ksr, vsr, kval, key0, c, slot)

    @jit
    def attn_ws(q, pos, qscale, P, k_words, k_scales, v_words, v_scales, gscale, table, ws_acc, ws_ml, out16, to16):
        # dynamic: [K buffers | V buffers | Q of the two consumer warpgroups]
        if SIM:
            dyn = cuda.shared.array(0, np.dtype(np.uint32))
        else:
            dyn = cuda.shared.array(0, np.uint32, alignment=128)
        KS = dyn[:SBW]
        VS = dyn[SBW:2 * SBW]
        ksr = cuda.shared.array(SCH, np.float32)
        vsr = cuda.shared.array(SCH, np.float32)
        kval = cuda.shared.array(SCH, np.int32)
        pos0 = read_pos(pos)
        T = q.shape[0]
        split = cuda.blockIdx.y
        xz = cuda.blockIdx.x + cuda.gridDim.x * cuda.blockIdx.z  # heaviest first (attn_mma_fa)
        h = xz % cuda.gridDim.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane >> 2
        tig = lane & 3
        hq0 = h * G
        tqb0 = (cuda.gridDim.x - 1 - xz // cuda.gridDim.z) * (W * TPM)
        tqb_last = min(tqb0 + W * TPM, T) - 1
        tq0 = tqb0 + warp * TPM  # (consumer warps < W)
        # the role, through a shuffle so that ptxas sees it is warp-uniform (a divergent path around
        # the wgmmas serializes them, C7518; CUTLASS's canonical_warp_group_idx does the same)
        consumer = cuda.shfl_sync(0xFFFFFFFF, tid // 128, 0) < W // 4
        active = consumer and tq0 < T
        tq_last = min(tq0 + TPM, T) - 1
        Lb = pos0 + tqb_last + 1
        nsplit = cuda.gridDim.y
        kc = KSC / gscale[0, h]
        _, kb, ke, holes = split_range(table, h, P, pos0, T, Lb, split, nsplit, tid, TH_ALL)
        fastp = P % CHB == 0
        ntiles = (ke - kb + CHB - 1) // CHB if ke > kb else 0
        rpos = cuda.local.array(2, np.int64)
        qa = cuda.local.array((NS, 4), np.uint32)  # the consumers' A of the RS-form S
        cuda.syncthreads()

        if not consumer:  # ---- the producer warpgroup: every tile, NF in flight
            regs_give()
            ptid = tid - 32 * W
            c = IC * ((ptid >> 3) % NIR)  # the item's first chunk (8 consecutive threads: 8 keys)
            key0 = (ptid & 7) + 8 * (ptid // (8 * NIR))
            s0 = ws_slot()
            s1 = ws_slot()
            s2 = ws_slot()
            if ntiles > 0:
                ws_fetch(k_words, k_scales, v_words, v_scales, table, h, P, fastp, holes, kb, ke, key0, c, s0, KS, VS,
                         0)
            if COPY:
                cp_async_commit()
            if NF == 3:
                if ntiles > 1:
                    ws_fetch(k_words, k_scales, v_words, v_scales, table, h, P, fastp, holes, kb, ke, key0, c, s1,
                             KS, VS, 1)
                if COPY:
                    cp_async_commit()
            for tn in range((ntiles + NF - 1) // NF):  # the slots in turn (unrolled by hand: registers)
                t = NF * tn
                if NF == 2:
                    ws_step(k_words, k_scales, v_words, v_scales, table, h, P, fastp, holes, kb, ke, ntiles, t, KS,
                            VS, ksr, vsr, kval, key0, c, s1, s0, True)
                    ws_step(k_words, k_scales, v_words, v_scales, table, h, P, fastp, holes, kb, ke, ntiles, t + 1,
                            KS, VS, ksr, vsr, kval, key0, c, s0, s1, False)
                else:
                    ws_step(k_words, k_scales, v_words, v_scales, table, h, P, fastp, holes, kb, ke, ntiles, t, KS,
                            VS, ksr, vsr, kval, key0, c, s2, s0, True)
                    ws_step(k_words, k_scales, v_words, v_scales, table, h, P, fastp, holes, kb, ke, ntiles, t + 1,
                            KS, VS, ksr, vsr, kval, key0, c, s0, s1, False)
                    ws_step(k_words, k_scales, v_words, v_scales, table, h, P, fastp, holes, kb, ke, ntiles, t + 2,
                            KS, VS, ksr, vsr, kval, key0, c, s1, s2, False)
            return

        # ---- the consumer warpgroups: S = Q K^T, softmax, O += P V (FA3's in-warpgroup overlap)
        regs_take()
        load_q(q, qscale, pos0, tq0, tq_last, T, active, hq0, gid, tig, rpos, qa)  # here: the consumers' registers
        acc = cuda.local.array((ND8, 4), np.float32)
        for n in range(ND8):
            for i in range(4):
                acc[n, i] = f32(0.0)
        m0 = _NEG_INF
        m1 = _NEG_INF
        l0 = f32(0.0)
        l1 = f32(0.0)
        sv = cuda.local.array((NKT, 4), np.float32)
        pa = cuda.local.array((NVS, 4), np.uint32)
        grp = warp >> 2  # the consumer warpgroup
        full0 = 1 + (grp * NBUF if PPW else 0)  # this warpgroup's FULL(0)
        if ntiles == 0:  # before any wgmma: O += P V on a buffer never written could read NaNs
            write_rows(active, split, nsplit, tq0, hq0, gid, tig, T, acc, m0, m1, l0, l1, gscale, h, ws_acc, ws_ml,
                       out16, to16)
            return
        bar_sync(full0, FULL_CNT)  # tile 0: S and its softmax, waited for
        wg_s(sv, qa, dyn, u32(0))
        scale_mask(sv, ksr, kval, 0, kb, ke, holes, tig, rpos, holes or kb + CHB > ke or kb + CHB - 1 > pos0 + tq0)
        mx0, mx1 = row_max(sv, kc)
        m0, m1, l0, l1, al0, al1 = online_max(m0, m1, l0, l1, mx0, mx1)
        l0, l1 = exp_sum(sv, kc, m0, m1, l0, l1)
        for v in range(NVS):
            pa[v, 0], pa[v, 1], pa[v, 2], pa[v, 3] = pack_p(sv, v, vsr, 0, tig)
        # Each pass: issue S of tile ti + 1 and O += P V of tile ti, wait for the S only, run tile
        # ti + 1's softmax under the O += P V, then wait for it, rescale O and pack the next P. A pass
        # past the last tile issues an S on a buffer nobody writes any more, whose scores the mask
        # drops whole (p = 0, m and l unchanged), and leaves after the wait: every path issues the same
        # wgmmas and none is in flight at the exit, or ptxas serializes them all (C7514 / C7518).
        # PPW: warpgroup 0 issues first; after its k-th issue it hands the turn to warpgroup 1, whose
        # k-th issue hands it back (the first turn is warpgroup 1's arrival here, the last one
        # warpgroup 0 takes after the loop: every barrier phase completes)
        if PPW and grp == 1:
            bar_arrive(TURN0, 256)
        ti = 0
        while True:
            b = ti % NBUF
            b1 = (ti + 1) % NBUF
            if ti + 1 < ntiles:
                bar_sync(full0 + b1, FULL_CNT)  # tile ti + 1 has landed
            o_fence(acc)
            if PPW:
                bar_sync(TURN0 + grp, 256)
            wg_s_rs(sv, qa, dyn, u32(b1 * BUFW))
            wg_pv(acc, pa, VS, u32(b * BUFW))
            if PPW:
                bar_arrive(TURN0 + 1 - grp, 256)
            s_retire(sv)  # S of tile ti + 1 (O += P V runs on)
            k1 = kb + (ti + 1) * CHB
            scale_mask(sv, ksr, kval, b1 * CHB, k1, ke, holes, tig, rpos,
                       holes or k1 + CHB > ke or k1 + CHB - 1 > pos0 + tq0)
            mx0, mx1 = row_max(sv, kc)
            m0, m1, l0, l1, al0, al1 = online_max(m0, m1, l0, l1, mx0, mx1)
            l0, l1 = exp_sum(sv, kc, m0, m1, l0, l1)
            # the wait for O += P V of tile ti, after a branch: in the softmax's basic block ptxas
            # hoisted it above the exponentials, which then ran after the O += P V instead of under it
            if ti + 1 >= ntiles:
                wg_sa_wait(acc, pa, sv)
                break
            wg_sa_wait(acc, pa, sv)
            if ti + NBUF < ntiles:  # tile ti's buffer goes back
                bar_arrive(EMPTY0 + b, TH_ALL)
            scale_acc(acc, al0, al1)
            for v in range(NVS):
                pa[v, 0], pa[v, 1], pa[v, 2], pa[v, 3] = pack_p(sv, v, vsr, b1 * CHB, tig)
            ti += 1
        if PPW and grp == 0:
            bar_sync(TURN0, 256)  # warpgroup 1's last turn
        write_rows(active, split, nsplit, tq0, hq0, gid, tig, T, acc, m0, m1, l0, l1, gscale, h, ws_acc, ws_ml,
                   out16, to16)

    return attn_ws if WS else attn_mma_fa


def _build_predecode(fmt: int, D: int, devpos: bool):
    """Decode one 4-bit plane of a layer's pages, keys 0..pos0 + T - 1 of every kv head, into the
    fa kernel's 16-bit shared-row form (`_build_prefill_fa`, pre=...): out row r (the pool row, so
    the block table still applies) = D / 2 uint32 words, 8-dim chunk c at words 4c..4c+3 in the
    decoder's pair order, times the E4M3 group scale, by the same instructions as the kernel's
    own per-block decode. One thread per (kv head, key, chunk); the grid covers `L_plan` keys
    per head (a device-position launch: the cache's capacity); threads past pos0 + T or on an
    unallocated page do nothing."""
    NC, RW, SW, RS = D // 8, D // _VPW[fmt], D // 64, D // 2
    dec8 = dec8_iso3 if fmt == ISO3 else dec4_e2m1
    read_pos = _pos_dev if devpos else _pos_int
    IX = np.uint64

    @cuda_kernel
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


def prefill_tokens_per_block(G: int, warps: int = NWARPS) -> int:
    return warps * (16 // G)


_PREFILL: dict = {}


def get_prefill_kernel(kf: int, vf: int, G: int, D: int, devpos: bool = False, *, kind: str = "fa", warps: int = 4,
                       max_registers=None, chb: int = 0, pre: tuple = (False, False), pingpong: bool = False,
                       pv_async: bool = False, ws: bool = False, depth: int = 2):
    """The prefill kernel `_build_prefill_fa`: kind "fa" (FA2-style on mma.sync, pipelined shared
    K/V tiles) or "wg" (the same on warpgroup MMAs, sm_90a; launched with `wg_smem_bytes(D, chb)`
    of dynamic shared memory after `wg_prepare`). Both launch as grid (query blocks, splits, kv
    heads) x 32 `warps` threads (ws: + a producer warpgroup, `prefill_threads`). pre: pre-decoded
    4-bit K / V planes (`launch_predecode`)."""
    if kind not in ("fa", "wg"):
        raise ValueError(f"attention_prefill: unknown prefill kernel {kind!r} (fa or wg)")
    pre = (bool(pre[0]), bool(pre[1]))
    pingpong = bool(pingpong) and kind == "wg"
    ws = bool(ws)
    pv_async = bool(pv_async) and kind == "wg"
    depth = int(depth) if ws else 2
    if ws and max_registers is None:  # one block an SM: 65536 / its threads, a multiple of 8
        max_registers = 65536 // prefill_threads(warps, ws) // 8 * 8
    key = (int(kf), int(vf), int(G), int(D), bool(devpos), kind, int(warps), max_registers, int(chb), pre, pingpong,
           pv_async, ws, depth)
    if key not in _PREFILL:
        if not supports(kf, vf, G, D):
            raise ValueError(f"attention_prefill: unsupported K={kf} V={vf} G={G} D={D}")
        _PREFILL[key] = _build_prefill_fa(kf, vf, G, D, devpos, warps, max_registers, pre, kind == "wg", chb, pingpong,
                                          pv_async, ws, depth)
    return _PREFILL[key]


def prefill_threads(warps: int, ws: bool = False) -> int:
    """Threads of a prefill block: `warps` computing warps, and ws's producer warpgroup."""
    return 32 * warps + (128 if ws else 0)


def tile_keys(D: int, wg: bool, chb: int = 0) -> int:
    """Keys per shared K/V tile: chb, else 4096 / D ("fa": K + V, two buffers = 32 KB) or 8192 / D
    ("wg": 64 KB of dynamic shared memory)."""
    return chb or (8192 if wg else 4096) // D


def wg_smem_bytes(D: int, chb: int = 0, warps: int = 8, ws: bool = False) -> int:
    """Dynamic shared memory of the "wg" kernel: K and V tiles, two buffers each (ws: WS_STAGES,
    and room for each warpgroup's 64 rows of Q, which it has kept in registers since session 35:
    32 KB at d 128 that a smaller carve-out would give to L1; not yet timed), 16-bit values."""
    if ws:
        return 4 * WS_STAGES * tile_keys(D, True, chb) * D + (warps // 4) * 128 * D
    return 8 * tile_keys(D, True, chb) * D


_WG_READY: set = set()


def prefill_sig(kf, vf, devpos=False) -> str:
    """The prefill kernel's signature: the decode kernels' (`kernel_sig`), then out16 [T, Hq, D]
    uint16 and to16: a one-split launch (no merge) also writes its output rounded to bf16 / fp16
    there (attention_cuda.TO16_BF16 / TO16_FP16; TO16_NONE: nothing)."""
    return kernel_sig(kf, vf, devpos)[:-1] + ", uint16[:,:,::1], int64)"


def wg_prepare(kern, sig: str, nbytes: int) -> None:
    """Let the "wg" kernel compiled for `sig` (`prefill_sig`, the types of its launches) have
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


def _ptx_signatures() -> tuple[list, list]:
    """(CI's list: "fa" for each format and lane layout, the runtime's device-position builds on
    sm_90 (`attention_cuda._prefill_auto`'s wg8a, and wg8w for its wg8w3: the same code at depth 2,
    since depth 3 took 30 s more of CI's 2 cores), a pre-decoded plane and its predecode; the rest,
    run with -m slow: the benchmark's other variants and shapes, wg8w3 and int8 wg8w among them)."""
    fm = [BF16, INT8, NVFP4, ISO3]
    out = [(get_prefill_kernel(f, f, 2, 128), prefill_sig(f, f)) for f in fm]
    out += [(get_prefill_kernel(INT8, NVFP4, 6, 256), prefill_sig(INT8, NVFP4)),
            (get_prefill_kernel(BF16, INT8, 1, 64), prefill_sig(BF16, INT8)),
            (get_prefill_kernel(ISO3, BF16, 8, 128, True), prefill_sig(ISO3, BF16, True)),
            (get_prefill_kernel(NVFP4, ISO3, 2, 128, True, pre=(True, True)), prefill_sig(NVFP4, ISO3, True))]
    wg8a = {"kind": "wg", "warps": 8, "pv_async": True}
    out += [(get_prefill_kernel(NVFP4, NVFP4, 2, 128, True, **wg8a), prefill_sig(NVFP4, NVFP4, True)),
            (get_prefill_kernel(ISO3, NVFP4, 2, 128, True, **wg8a), prefill_sig(ISO3, NVFP4, True)),
            (get_prefill_kernel(BF16, BF16, 2, 128, True, **wg8a), prefill_sig(BF16, BF16, True)),
            (get_prefill_kernel(INT8, INT8, 2, 128, True, **wg8a), prefill_sig(INT8, INT8, True)),
            (get_prefill_kernel(INT8, NVFP4, 4, 64, kind="wg"), prefill_sig(INT8, NVFP4)),
            (get_prefill_kernel(NVFP4, NVFP4, 2, 128, True, ws=True, **wg8a),
             prefill_sig(NVFP4, NVFP4, True))]
    predecode_sig = ("void({}, int64, int64, int64, uint32[::1], uint32[::1], int32[:,:,::1], int64, "
                     "uint32[::1])")
    out += [(_build_predecode(fmt, 128, True), predecode_sig.format("int32[::1]")) for fmt in (NVFP4, ISO3)]
    more = [(get_prefill_kernel(NVFP4, ISO3, 4, 128), prefill_sig(NVFP4, ISO3)),
            (get_prefill_kernel(NVFP4, NVFP4, 2, 128, warps=8), prefill_sig(NVFP4, NVFP4)),
            (get_prefill_kernel(BF16, BF16, 4, 128, warps=8), prefill_sig(BF16, BF16)),
            (get_prefill_kernel(INT8, NVFP4, 4, 64, pre=(False, True)), prefill_sig(INT8, NVFP4))]
    more += [(get_prefill_kernel(f, f, 2, 128, kind="wg"), prefill_sig(f, f)) for f in fm]
    more += [(get_prefill_kernel(NVFP4, NVFP4, 2, 128, True, kind="wg", pre=(True, True)),
              prefill_sig(NVFP4, NVFP4, True)),
             (get_prefill_kernel(BF16, BF16, 2, 128, True, kind="wg", warps=8), prefill_sig(BF16, BF16, True)),
             (get_prefill_kernel(BF16, INT8, 4, 128, **wg8a), prefill_sig(BF16, INT8)),
             (get_prefill_kernel(INT8, ISO3, 4, 64, ws=True, **wg8a), prefill_sig(INT8, ISO3)),
             (get_prefill_kernel(ISO3, NVFP4, 2, 64, True, ws=True, **wg8a),
              prefill_sig(ISO3, NVFP4, True)),
             (get_prefill_kernel(ISO3, ISO3, 2, 128, True, ws=True, depth=3, **wg8a), prefill_sig(ISO3, ISO3, True)),
             (get_prefill_kernel(NVFP4, ISO3, 2, 128, True, ws=True, depth=3,
                                 pingpong=True, **wg8a), prefill_sig(NVFP4, ISO3, True)),
             (get_prefill_kernel(INT8, INT8, 2, 128, True, ws=True, **wg8a),
              prefill_sig(INT8, INT8, True)),
             # bf16 planes by cp.async in the producer: both, at depth 3; one, at depth 2 with turns
             (get_prefill_kernel(BF16, BF16, 2, 128, True, ws=True, depth=3, **wg8a),
              prefill_sig(BF16, BF16, True)),
             (get_prefill_kernel(BF16, INT8, 2, 128, True, ws=True, pingpong=True, **wg8a),
              prefill_sig(BF16, INT8, True))]
    more += [(_build_predecode(fmt, 128, False), predecode_sig.format("int64")) for fmt in (NVFP4, ISO3)]
    return out, more


PTX_SIGNATURES, PTX_SIGNATURES_MORE = _ptx_signatures()
