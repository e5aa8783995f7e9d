"""Tensor-core decode/prefill attention over the paged, mixed-format KV cache (GPU only).

Same contract, grid, split plan and reduction as attention_cuda (one warp = one page range of a
(query token, kv head); the G <= 8 q heads of the kv group share every page read; the block's
warps merge their partials in shared memory, so the workspace has one split per block), but both
products run on `mma.sync.aligned.m16n8k16` (inline PTX; Numba has no WMMA API) with fp32
accumulation, and codes are decoded straight from registers into 16-bit operand pairs:

  K phase, per 8-token tile:  S[g, tok] = sum_d q[g, d] K[tok, d]      A = q (rows g, 8 of 16 used,
      held in registers for the whole kernel), B = K^T (n = tok: lane (gid, tig) loads the row of
      token gid). For the 4-bit formats every k16 step is one 16-value scale group, so the E4M3
      group scale is multiplied into the step's B operands (mul.f16x2; the E2M1 decode's 2^-14 is
      undone on the fp32 result); int8's row scale once per tile; bf16 needs none. The `tm` build
      swaps the operands (A = K with 16 tokens on the rows, B = q^T): one MMA per 16 tokens a step,
      the softmax per head pair over 8 lanes, and P transposed by movmatrix for the V phase.
  softmax: lane (gid, tig) holds S[g = gid, tok = 2 tig, 2 tig + 1] of each tile: row max over the
      4 lanes of a row, lazy rescaling as in attention_cuda (the max moves only when it grows by
      more than 2^8), p = exp2(s - m) in fp32.
  V phase, per 16 tokens: O^T[d, g] += V^T[d, tok] P^T[tok, g]   A = V^T (rows d, k = tok), B = P^T,
      which is exactly the K phase's accumulator layout of two tiles (no shuffle, as in FA2).
      Scales vary along the reduction (tokens): the 4-bit formats' E4M3 group scales go into A with
      the codes (two tokens' scales a register), int8's row scales into B (P * row scale).

Operand decoding: E2M1 nibble s|eem -> fp16 bits (s << 15) | (eem << 9) = value * 2^-14
(0.5 an fp16 subnormal), times the group scale by mul.f16x2 (exact for every normal E4M3 scale,
>= 2^-6); ISO3 nibble s|mmm -> fp16
(0x6400 | mmm) - 1024 with the sign or-ed in; int8 -> fp16 (0x6400 | (b ^ 0x80)) - 1152
(byte_perm); bf16 codes are bf16 operands as stored. The global scales (1/g) are folded into the
shared E4M3 table (K) and one multiply at the end (V). Only q and p are rounded to 16 bits (fp16,
or bf16 where the other operand is bf16), as in flash attention; accumulation is fp32.
int8 keys are not decoded at all (`k8`, the default): their K product runs on the integer tensor
cores (mma.m16n8k32.s8, exact int32 sums) with q as a 16-bit integer per head in two int8 rows.
The `bulk` build (the 4-bit formats' default) reads each chunk from a two-stage ring in shared
memory that one lane fills with cp.async.bulk copies, instead of from global memory: the same
values in the same order (docs/kernels.md "The bulk ring").

This file is the decode kernel (one query token per warp-split); the prefill kernels (query
tokens on the MMA rows) are in attention_prefill.py, the inline-PTX primitives and their
simulator emulations in mma_ptx.py.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from coldkv.numba_kernels.jit_cache import cuda_kernel
from coldkv.numba_kernels import attention_cuda
from coldkv.numba_kernels.attention_cuda import _pos_dev, _pos_int
from numba import types

from coldkv.numba_kernels.fp import bits_f32, f32_bits
from coldkv.numba_kernels.mma_ptx import (  # noqa: F401 (_sim_install: attention_cuda)
    SIMULATED, _asm, _sim_install, bulk_g2s, dec_i8, e2m1_pair, e4m3x2, ex2, griddep_launch, ldg2, ldg4, lds2, lds4,
    mbar_arrive_tx, mbar_fence_init, mbar_init, mbar_wait, mma_bf16, mma_f16, mma_s8, movm_t, mul_f16x2, pack_bf16,
    pack_f16, prmt)
from coldkv.numba_kernels.quant import BF16, INT8, ISO3, NVFP4

NWARPS = 4
THREADS = 32 * NWARPS
_LAZY = np.float32(8.0)
_NEG_INF = np.float32(-np.inf)
_VPW = {BF16: 2, INT8: 4, NVFP4: 8, ISO3: 8}

# ------------------------------------------------------------------------------ operand decoders
# (E2M1: mma_ptx.e2m1_pair, shared with the prefill kernels)


def _sim_sub_f16x2(a, b):
    from coldkv.numba_kernels.mma_ptx import _sim_f16x2

    return _sim_f16x2(lambda u, v: u - v, a, b)


sub_f16x2 = _sim_sub_f16x2 if SIMULATED else _asm("sub.rn.f16x2 $0, $1, $2;", "=r,r,r", types.uint32,
                                                   (types.uint32, types.uint32))


@cuda.jit(device=True, inline=True)
def _iso3_bits(x, a):
    """fp16x2 of the ISO3 nibbles a, a + 4 of x (sign bit 3, magnitude 0..7): (1024 + m) - 1024,
    the sign or-ed in."""
    m = ((x >> (4 * a)) & 0x00070007) | 0x64006400
    sg = ((x << (12 - 4 * a)) & 0x80008000) if a < 3 else (x & 0x80008000)
    return sub_f16x2(m, 0x64006400) | sg


# ------------------------------------------------------------------------------ the kernel
def supports(kf: int, vf: int, G: int, D: int) -> bool:
    return G <= 8 and D % 64 == 0 and D <= 256 and kf in _VPW and vf in _VPW


# k8's q: biased float32 exponent of the power of two 2^k with max|q| 2^k < 2^14 is this minus
# the max's own biased exponent (2^k = bits (eb << 23))
_Q16_EB = 253 + 14


def ref_q_int16(x: np.ndarray) -> np.ndarray:
    """The spec of k8's q: x = q * sm_scale * log2(e) [..., D] float32; per row the power of two
    2^k with max|x| 2^k < 2^14 (picked from the float32 exponent of the max, as the kernel does),
    x 2^k rounded to the nearest integer (ties to even); returns those integers / 2^k."""
    x = np.asarray(x, np.float32)
    m = np.abs(x).max(axis=-1, keepdims=True)
    eb = np.clip(_Q16_EB - ((m.view(np.uint32) >> 23) & 0xFF).astype(np.int64), 1, 253)
    p2 = (eb.astype(np.uint32) << 23).view(np.float32)
    return (np.rint(x * p2).astype(np.float64) / p2).astype(np.float32)


STAGES = 2  # the bulk ring's chunks a warp (3: no faster, H100 at 774749f)


def _ring_layout(kf: int, vf: int, G: int, D: int, nt: int = 0) -> tuple:
    """The bulk ring in 32-bit words: a stage's parts (K codes, V codes, K scales, V scales) of one
    chunk, and the ring's size (STAGES stages a warp, or the block merge's [warp, g, d] and
    [warp, g, (m, l)] where larger: the merge reuses it)."""
    ch = 8 * (nt or 2)

    def scale_words(f):  # E4M3 bytes (4-bit), one float32 (int8), none (bf16) a row
        return 0 if f == BF16 else ch * (D // 64 if f in (NVFP4, ISO3) else 1)
    parts = (ch * D // _VPW[kf], ch * D // _VPW[vf], scale_words(kf), scale_words(vf))
    return parts, max(NWARPS * STAGES * sum(parts), NWARPS * G * (D + 2))


def bulk_smem_bytes(kf: int, vf: int, G: int, D: int, nt: int = 0, qsmem: bool = False) -> int:
    """Static shared memory of the `bulk` build: the ring, its mbarriers, q's fragments with qsmem."""
    qs = NWARPS * 32 * (D // 8) if qsmem else 0  # a lane's D / 8 words of q fragments
    return 4 * (_ring_layout(kf, vf, G, D, nt)[1] + qs) + 8 * NWARPS * STAGES


def supports_bulk(kf: int, vf: int, G: int, D: int, nt: int = 0, qsmem: bool = False) -> bool:
    """The `bulk` ring fits the 48 KB of static shared memory (4-bit and int8 pages at d <= 128)."""
    return supports(kf, vf, G, D) and bulk_smem_bytes(kf, vf, G, D, nt, qsmem) <= 48 * 1024


def supports_tm(kf: int, vf: int, G: int, D: int) -> bool:
    """The K product with tokens on the MMA rows (`tm`): 4-bit or bf16 keys; V not int8 (its row
    scales go into P per token before the transpose, which this build does not do)."""
    return supports(kf, vf, G, D) and kf in (NVFP4, ISO3, BF16) and vf != INT8


def supports_k8(kf: int, G: int, D: int) -> bool:
    """The K product on 8-bit integer tensor cores (`k8`): int8 keys (G <= 8, as `supports`)."""
    return kf == INT8 and G <= 8 and D % 64 == 0 and D <= 256


def _build(kf: int, vf: int, G: int, D: int, devpos: bool, nt: int = 0, max_registers=None, u64: bool = True,
           pipe: bool = False, k8: bool = False, qsmem: bool = False, bulk: bool = False, tm: bool = False,
           pdl: bool = False):
    NS = D // 16  # k16 steps of the K phase = 16-dim tiles of the V phase
    RWK, RWV = D // _VPW[kf], D // _VPW[vf]  # 32-bit code words per row
    SW = D // 64  # E4M3 scale words per row (4-bit formats)
    NT = nt or 2  # 8-token K tiles per chunk (even; registers grow with it)
    CH = 8 * NT
    NT2 = NT // 2  # 16-token V steps per chunk
    K4, V4 = kf in (NVFP4, ISO3), vf in (NVFP4, ISO3)
    # 4-bit K: lane (gid, tig) holds WPL consecutive words of token gid's row (its quarter; step s
    # reads word s >> 1, nibble pairs (0,4),(1,5) or (2,6),(3,7)), so every code word is loaded
    # and decoded by one lane, with constant shifts. Its GPL scale groups start at byte tig * GPL.
    WPL = RWK // 4
    GPL = WPL // 2
    KW = NS if kf == INT8 else (WPL if K4 else 2 * NS)  # K code words a lane holds per token
    # 4-bit V: lane (gid, tig) reads words gid + 8k (k < NS / 4) of its 4 tokens' rows; tile j
    # takes nibbles (j & 3, + 4) of word gid + 8 (j >> 2): output rows gid / gid + 8 are dims
    # 8 (gid + 8 (j >> 2)) + (j & 3) / + 4, scale group (gid >> 1) + 4 (j >> 2): word j >> 2.
    # int8 K: lane tig holds words tig * NS + s (its quarter of the row, 128-bit loads; step s its
    # word s). int8 V: lane gid holds words gid * VW .. (its eighth of the row); tile j takes bytes
    # 2 (j & 1), + 1 of word j >> 1: output rows gid / gid + 8 are dims (D / 8) gid + 2j / + 1.
    VW = NS // 4 if V4 else (D // 32 if vf == INT8 else NS)  # V code words a lane holds per token row
    mma_k = mma_bf16 if kf == BF16 else mma_f16
    mma_v = mma_bf16 if vf == BF16 else mma_f16
    pack_k = pack_bf16 if kf == BF16 else pack_f16
    pack_v = pack_bf16 if vf == BF16 else pack_f16
    # k8, int8 keys: mma.m16n8k32.s32.s8.s8 on the int8 codes as stored (no decode; lane tig's step s
    # is its words 2 s, 2 s + 1). q per head x 2^k rounded to an integer q16 (|q16| <= 2^14) and split
    # as q16 = 256 hi + lo (hi, lo int8): rows gid (hi) and gid + 8 (lo) of head gid, so one MMA per
    # k32 step; the exact int32 sums give 256 c_hi + c_lo, times the row scale and 2^-k.
    if k8 and not supports_k8(kf, G, D):
        raise ValueError(f"attention_mma: k8 needs int8 keys (K={kf})")
    I8 = bool(k8)
    # tm: the K product with the chunk's tokens on the 16 MMA rows and the q heads on the 8 columns
    # (A = K, B = q^T: one MMA per k16 step for 16 tokens instead of two with 12 of q's 16 rows
    # zero). Lane (gid, tig) then holds S of tokens gid, gid + 8 for heads 2 tig, 2 tig + 1, so the
    # softmax runs per head pair over the 8 lanes of a tig, and movmatrix transposes P into the V
    # product's B (its layout is the K product's accumulator with tokens and heads swapped).
    TM = bool(tm)
    if TM and not supports_tm(kf, vf, G, D):
        raise ValueError(f"attention_mma: tm needs 4-bit or bf16 keys and V not int8 (K={kf} V={vf})")
    # qsmem: q's A fragments in shared memory, a lane's words at [warp, ..., lane] (conflict-free),
    # instead of 16 registers: int8 then fits 96 registers (8 spilled bytes, per page) and 5 blocks
    # an SM instead of 4 (the kernel waits on its loads; kernels.md "Where each kernel stands")
    QS = bool(qsmem)
    QL = (NS // 2, 4, 1) if I8 else (2, NS, 1)  # in registers: a lane's own [..., 0]
    QSA = (NWARPS,) + QL[:2] + (32,) if QS else (1, 1, 1, 1)
    KSC = np.float32(2.0 ** 14 if kf == NVFP4 else 1.0)  # the E2M1 decode's 2^-14, undone in fp32
    VSC = np.float32(2.0 ** 14 if vf == NVFP4 else 1.0)
    read_pos = _pos_dev if devpos else _pos_int
    PIPE = bool(pipe)
    SMA, SMM = NWARPS * G * D, NWARPS * G * 2  # shared sizes of the block merge
    # bulk: each warp's chunks come through a ring of STG stages in shared memory, filled by
    # cp.async.bulk (one lane issues the chunk's 2-4 copies, an mbarrier per stage says they landed),
    # the next chunk's copy in flight during this one's work. The loads then hold no registers and
    # cost no issue slots (the plain kernel waits on its loads: kernels.md "Where each kernel
    # stands"). Needs pages of a multiple of CH rows (whole chunks; scale copies rounded up to 16 B).
    BULK = bool(bulk)
    if BULK and pipe:
        raise ValueError("attention_mma: bulk is its own pipeline (no pipe)")
    STG = STAGES
    # a stage: [K codes | V codes | K scales | V scales] of a chunk, in words
    (SKW, SVW, SKS, SVS), RING = _ring_layout(kf, vf, G, D, nt)
    KSR, VSR = SKS // CH, SVS // CH  # scale words per row (int8: one float32; bf16: none)
    STW = SKW + SVW + SKS + SVS  # words of a stage (a multiple of 16: 64-byte aligned stages)
    RING = RING if BULK else 1
    SMA_, SMM_, NBAR = (1, 1, NWARPS * STG) if BULK else (SMA, SMM, 1)  # the merge's own arrays; the mbarriers
    LD2, LD4 = (lds2, lds4) if BULK else (ldg2, ldg4)
    # bulk + tm: each 16-token step's K (and V) words are read from the stage right before its MMAs
    # instead of the whole chunk's into registers first, so registers do not grow with the chunk
    STREAM = BULK and TM
    KT, VT = (2, 1) if STREAM else (NT, NT2)  # K tiles / V steps held in registers at a time
    # Global indices as uint64 (the default: drops Numba's negative-index wraparound, a compare +
    # select per access) or int64.
    IX = np.uint64 if u64 else np.int64
    f32 = np.float32
    u32 = np.uint32
    i64 = np.int64
    i32 = np.int32

    @cuda.jit(device=True, inline=True)
    def dec_k(x, a):
        return e2m1_pair(x, a) if kf == NVFP4 else _iso3_bits(x, a)

    @cuda.jit(device=True, inline=True)
    def dec_v(x, a):
        return e2m1_pair(x, a) if vf == NVFP4 else _iso3_bits(x, a)

    @cuda.jit(device=True, inline=True)
    def rd_f32(arr, i):
        """A float32 scale: from the bulk ring's uint32 words (its bits), else from the float32 pool."""
        return bits_f32(arr[i]) if BULK else f32(arr[i])

    @cuda.jit(device=True, inline=True)
    def row_at(kb, c0, r0, r1, last):
        """Row r0 + r1 of the chunk at c0, clamped to the page's last valid one: the pool's, kb + page
        row (kb = -c0 with bulk: the stage's), or with bulk and tm the stage's in 32 bits (ptxas 13.0:
        20-50 fewer instructions a chunk with tm; the plain bulk build spills 8 bytes with them).
        (c0 + r0) + r1 as the builds measured before tm added it: int8's loop is 11 instructions
        shorter summed as c0 + (r0 + r1), a change nobody has timed.)"""
        if BULK and TM:
            return i32(min(i32(r0 + r1), i32(last - c0)))
        return kb + min(c0 + r0 + r1, last)

    @cuda.jit(device=True, inline=True)
    def load_k(k_words, k_scales, kreg, ksc, krs, kb, c0, last, tig, gid, ko, so, u0):
        """K of the chunk's tiles u0 .. u0 + KT - 1 into kreg[0 ..]: lane holds (its part of) the
        row of token gid of each tile (clamped to the page's last valid row; row r of the page at
        kb + r; codes from word ko, scales from so on: the bulk ring's stage, else 0)."""
        for uu in range(KT):
            u = uu + u0
            row = row_at(kb, c0, 8 * u, gid, last)
            if K4:
                if WPL % 4 == 0:
                    for m in range(WPL // 4):
                        a, b, c, d = LD4(k_words, ko + row * RWK + tig * WPL + 4 * m)
                        kreg[uu, 4 * m] = a
                        kreg[uu, 4 * m + 1] = b
                        kreg[uu, 4 * m + 2] = c
                        kreg[uu, 4 * m + 3] = d
                else:
                    for m in range(WPL // 2):
                        a, b = LD2(k_words, ko + row * RWK + tig * WPL + 2 * m)
                        kreg[uu, 2 * m] = a
                        kreg[uu, 2 * m + 1] = b
                w0 = (tig * GPL) >> 2  # the scale word(s) of this lane's groups (3 groups may straddle two)
                ksc[uu, 0] = k_scales[IX(so + row * SW + w0)]
                ksc[uu, 1] = k_scales[IX(so + row * SW + min(w0 + 1, SW - 1))] if GPL == 3 else ksc[uu, 0]
            elif kf == BF16:
                for s in range(NS):
                    a, b = LD2(k_words, ko + row * RWK + 8 * s + 2 * tig)
                    kreg[uu, 2 * s] = a
                    kreg[uu, 2 * s + 1] = b
            else:
                fl = u32(0) if I8 else u32(0x80808080)  # the fp16 decode's offset; s8 MMAs take the codes
                for m in range(NS // 4):
                    a, b, c, d = LD4(k_words, ko + row * RWK + tig * NS + 4 * m)
                    kreg[uu, 4 * m] = a ^ fl
                    kreg[uu, 4 * m + 1] = b ^ fl
                    kreg[uu, 4 * m + 2] = c ^ fl
                    kreg[uu, 4 * m + 3] = d ^ fl
                for i in range(2):  # row scales of the tokens of this lane's columns
                    krs[uu, i] = rd_f32(k_scales, IX(so + kb + min(c0 + 8 * u + 2 * tig + i, last)))

    @cuda.jit(device=True, inline=True)
    def load_v(v_words, v_scales, vreg, vsc, vrs, vb, c0, last, tig, gid, vo, so, v0):
        """V code words (and scales) of the chunk's 16-token steps v0 .. v0 + VT - 1 into vreg[0 ..]:
        tokens 2tig, 2tig+1, 2tig+8, 2tig+9 of each step (clamped to the page's last valid row), the
        words of this lane's dims (codes from word vo, scales from so on, as load_k)."""
        for vv in range(VT):
            v = vv + v0
            for i in range(4):
                row = row_at(vb, c0, 16 * v, 2 * tig + (i & 1) + 8 * (i >> 1), last)
                if vf == INT8 and VW % 4 == 0:
                    for m in range(VW // 4):
                        a, b, c, d = LD4(v_words, vo + row * RWV + gid * VW + 4 * m)
                        vreg[vv, i, 4 * m] = a ^ u32(0x80808080)
                        vreg[vv, i, 4 * m + 1] = b ^ u32(0x80808080)
                        vreg[vv, i, 4 * m + 2] = c ^ u32(0x80808080)
                        vreg[vv, i, 4 * m + 3] = d ^ u32(0x80808080)
                elif vf == INT8:
                    for m in range(VW // 2):
                        a, b = LD2(v_words, vo + row * RWV + gid * VW + 2 * m)
                        vreg[vv, i, 2 * m] = a ^ u32(0x80808080)
                        vreg[vv, i, 2 * m + 1] = b ^ u32(0x80808080)
                for j in range(VW):
                    if V4:
                        vreg[vv, i, j] = v_words[IX(vo + row * RWV + gid + 8 * j)]
                    elif vf == BF16:
                        vreg[vv, i, j] = v_words[IX(vo + row * RWV + 8 * j + gid)]
                if V4:
                    for w in range(SW):
                        vsc[vv, i, w] = v_scales[IX(so + row * SW + w)]
                elif vf == INT8:
                    vrs[vv, i] = rd_f32(v_scales, IX(so + row))

    @cuda.jit(device=True, inline=True)
    def k_operand(kreg, ksc, u, s, kb0):
        """The two 16-bit operand words of tile u (token gid's row), step s: B's (k 2tig, 2tig + 1 |
        + 8; col gid), or with tm A's (row gid | gid + 8 from tile u | u + 1; same k)."""
        if K4:  # group scale of the step's word (token gid) multiplied in
            bsel = kb0 + u32(s >> 2)
            sp = e4m3x2(ksc[u, 0], ksc[u, 1], bsel | (bsel << 4))
            x = kreg[u, s >> 1]
            return mul_f16x2(dec_k(x, 2 * (s & 1)), sp), mul_f16x2(dec_k(x, 2 * (s & 1) + 1), sp)
        return kreg[u, 2 * s], kreg[u, 2 * s + 1]  # bf16

    @cuda.jit(device=True, inline=True)
    def scores_tm(qa, kreg, ksc, krs, sv, kc, c0, nval, tig, gid, ql, ring, sb):
        """tm's K phase: S[tok, g] of 16 tokens a step into sv[u, i] = S[c0 + 8u + gid, 2tig + i]
        (STREAM: each step's two tiles read from the stage at word sb first)."""
        kb0 = u32((tig * GPL) & 3)
        for w in range(NT2):
            ku = 0 if STREAM else 2 * w  # the step's first tile in kreg
            if STREAM:
                load_k(ring, ring, kreg, ksc, krs, -c0, c0, nval - 1, tig, gid, sb, sb + SKW + SVW, 2 * w)
            c_0 = f32(0.0)
            c_1 = f32(0.0)
            c_2 = f32(0.0)
            c_3 = f32(0.0)
            for s in range(NS):
                a0, a2 = k_operand(kreg, ksc, ku, s, kb0)
                a1, a3 = k_operand(kreg, ksc, ku + 1, s, kb0)
                c_0, c_1, c_2, c_3 = mma_k(a0, a1, a2, a3, qa[0, s, ql], qa[1, s, ql], c_0, c_1, c_2, c_3)
            if K4:
                c_0 *= kc
                c_1 *= kc
                c_2 *= kc
                c_3 *= kc
            tok = c0 + 16 * w + gid
            sv[2 * w, 0] = c_0 if tok < nval else _NEG_INF
            sv[2 * w, 1] = c_1 if tok < nval else _NEG_INF
            sv[2 * w + 1, 0] = c_2 if tok + 8 < nval else _NEG_INF
            sv[2 * w + 1, 1] = c_3 if tok + 8 < nval else _NEG_INF

    @cuda.jit(device=True, inline=True)
    def scores(qa, kreg, ksc, krs, sv, kc, c0, nval, tig, ql):
        """K phase: S[g, tok] of the chunk's NT 8-token tiles into sv (-inf past nval)."""
        kb0 = u32((tig * GPL) & 3)  # byte of this lane's first scale group in ksc[u, 0]
        for u in range(NT):
            c_0 = f32(0.0)
            c_1 = f32(0.0)
            for s in range(NS):
                if kf != INT8:
                    b0, b1 = k_operand(kreg, ksc, u, s, kb0)
                else:
                    w = kreg[u, s]
                    b0 = dec_i8(w, 0x5140)
                    b1 = dec_i8(w, 0x7362)
                c_0, c_1, r2, r3 = mma_k(qa[0, s, ql], 0, qa[1, s, ql], 0, b0, b1, c_0, c_1, f32(0.0), f32(0.0))
            if kf == INT8:
                c_0 *= krs[u, 0]
                c_1 *= krs[u, 1]
            elif K4:
                c_0 *= kc
                c_1 *= kc
            tok = c0 + 8 * u + 2 * tig
            sv[u, 0] = c_0 if tok < nval else _NEG_INF
            sv[u, 1] = c_1 if tok + 1 < nval else _NEG_INF

    @cuda.jit(device=True, inline=True)
    def scores_i8(qa8, kreg, krs, sv, kc, c0, nval, tig, ql):
        """I8's K phase: S[g, tok] of the chunk's 8-token tiles into sv (-inf past nval)."""
        for u in range(NT):
            i_0 = i32(0)
            i_1 = i32(0)
            i_2 = i32(0)
            i_3 = i32(0)
            for s in range(NS // 2):
                i_0, i_1, i_2, i_3 = mma_s8(qa8[s, 0, ql], qa8[s, 1, ql], qa8[s, 2, ql], qa8[s, 3, ql], kreg[u, 2 * s],
                                            kreg[u, 2 * s + 1], i_0, i_1, i_2, i_3)
            tok = c0 + 8 * u + 2 * tig  # c_0 | c_2: q's hi | lo rows of head gid, token 2 tig (c_1 | c_3: + 1)
            x0 = f32(i_0 * i32(256) + i_2) * krs[u, 0] * kc
            x1 = f32(i_1 * i32(256) + i_3) * krs[u, 1] * kc
            sv[u, 0] = x0 if tok < nval else _NEG_INF
            sv[u, 1] = x1 if tok + 1 < nval else _NEG_INF

    @cuda.jit(device=True, inline=True)
    def k_phase(qa, kreg, ksc, krs, sv, kc, c0, nval, tig, gid, ql, ring, sb):
        if I8:
            scores_i8(qa, kreg, krs, sv, kc, c0, nval, tig, ql)
        elif TM:
            scores_tm(qa, kreg, ksc, krs, sv, kc, c0, nval, tig, gid, ql, ring, sb)
        else:
            scores(qa, kreg, ksc, krs, sv, kc, c0, nval, tig, ql)

    @cuda.jit(device=True, inline=True)
    def softmax_tm(sv, acc, ml):
        """tm's online softmax: heads 2tig, 2tig + 1 (ml: their running max and this lane's share of
        their sums, updated) over the 8 lanes of a tig; sv becomes p."""
        m0, m1, l0, l1 = ml[0], ml[1], ml[2], ml[3]
        x0 = _NEG_INF
        x1 = _NEG_INF
        for u in range(NT):
            x0 = max(x0, sv[u, 0])
            x1 = max(x1, sv[u, 1])
        for o in range(3):
            x0 = max(x0, cuda.shfl_xor_sync(0xFFFFFFFF, x0, 4 << o))
            x1 = max(x1, cuda.shfl_xor_sync(0xFFFFFFFF, x1, 4 << o))
        n0 = x0 > m0 + _LAZY
        n1 = x1 > m1 + _LAZY
        if cuda.any_sync(0xFFFFFFFF, n0 or n1):  # rare: a running max moves
            y0 = x0 if n0 else m0
            y1 = x1 if n1 else m1
            a0 = ex2(m0 - y0)
            a1 = ex2(m1 - y1)
            l0 *= a0
            l1 *= a1
            m0 = y0
            m1 = y1
            for j in range(NS):  # O^T columns 2tig | 2tig + 1
                acc[j, 0] *= a0
                acc[j, 1] *= a1
                acc[j, 2] *= a0
                acc[j, 3] *= a1
        for u in range(NT):
            p0 = ex2(sv[u, 0] - m0)
            p1 = ex2(sv[u, 1] - m1)
            l0 += p0
            l1 += p1
            sv[u, 0] = p0
            sv[u, 1] = p1
        ml[0] = m0
        ml[1] = m1
        ml[2] = l0
        ml[3] = l1

    @cuda.jit(device=True, inline=True)
    def tm_rows(ml, tig, gid):
        """tm's (m, l) per head pair -> the plain layout's (m_run, l_run) of head gid (l whole on
        lane tig 0, 0 on the others: the merge sums a row's 4 lanes)."""
        m0, m1, l0, l1 = ml[0], ml[1], ml[2], ml[3]
        for o in range(3):
            l0 += cuda.shfl_xor_sync(0xFFFFFFFF, l0, 4 << o)
            l1 += cuda.shfl_xor_sync(0xFFFFFFFF, l1, 4 << o)
        src = gid >> 1  # lane (0, gid >> 1) holds heads gid & ~1, gid | 1
        m0 = cuda.shfl_sync(0xFFFFFFFF, m0, src)
        m1 = cuda.shfl_sync(0xFFFFFFFF, m1, src)
        l0 = cuda.shfl_sync(0xFFFFFFFF, l0, src)
        l1 = cuda.shfl_sync(0xFFFFFFFF, l1, src)
        m = m1 if gid & 1 else m0
        l = l1 if gid & 1 else l0
        return m, (l if tig == 0 else f32(0.0))

    @cuda.jit(device=True, inline=True)
    def softmax_pv(sv, vreg, vsc, vrs, acc, m_run, l_run, ml, tig, gid, ring, sb, c0, last):
        """Online softmax of the chunk's scores, then O^T += V^T P^T per 16-token step; returns the
        new (m_run, l_run) of row g = gid. With tm the state is ml's instead (updated): the running
        max and this lane's share of the sum of heads 2tig, 2tig + 1 (m, m', l, l')."""
        if TM:
            softmax_tm(sv, acc, ml)
        else:
            m_run, l_run = softmax_rows(sv, acc, m_run, l_run, tig)
        pv(sv, vreg, vsc, vrs, acc, tig, gid, ring, sb, c0, last)
        return m_run, l_run

    @cuda.jit(device=True, inline=True)
    def softmax_rows(sv, acc, m_run, l_run, tig):
        """The online softmax of row g = gid over its 4 lanes; sv becomes p."""
        mx = _NEG_INF
        for u in range(NT):
            mx = max(mx, max(sv[u, 0], sv[u, 1]))
        mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
        mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
        need = mx > m_run + _LAZY
        if cuda.any_sync(0xFFFFFFFF, need):  # rare: the running max moves
            mnew = mx if need else m_run
            alpha = ex2(m_run - mnew)
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
                pr = ex2(sv[u, i] - m_run)  # one MUFU (mma_ptx.ex2)
                l_run += pr
                sv[u, i] = pr
        return m_run, l_run

    @cuda.jit(device=True, inline=True)
    def pv(sv, vreg, vsc, vrs, acc, tig, gid, ring, sb, c0, last):
        """O^T += V^T P^T per 16-token step of the chunk (sv: its p; STREAM: each step's V read from
        the stage at word sb first)."""
        bsel = u32(gid >> 1)  # V: this lane's scale byte within word j >> 2
        vsel = bsel | ((bsel + 4) << 4)
        for v in range(NT2):
            vv = 0 if STREAM else v  # the step in vreg
            if STREAM:
                load_v(ring, ring, vreg, vsc, vrs, -c0, c0, last, tig, gid, sb + SKW, sb + SKW + SVW + SKS, v)
            p0 = sv[2 * v, 0]  # tokens 2tig, 2tig+1 | 2tig+8, 2tig+9 of the step
            p1 = sv[2 * v, 1]
            p2 = sv[2 * v + 1, 0]
            p3 = sv[2 * v + 1, 1]
            if TM:  # [tok gid | gid + 8, head 2tig, 2tig + 1] -> B's [tok 2tig.. | 2tig + 8.., head gid]
                bb0 = movm_t(pack_v(p0, p1))
                bb1 = movm_t(pack_v(p2, p3))
            elif vf == INT8:
                bb0 = pack_v(p0 * vrs[vv, 0], p1 * vrs[vv, 1])
                bb1 = pack_v(p2 * vrs[vv, 2], p3 * vrs[vv, 3])
            else:
                bb0 = pack_v(p0, p1)
                bb1 = pack_v(p2, p3)
            for j in range(NS):
                if V4:  # scales of tokens t0 | t1 (a0, a1) and t2 | t3 (a2, a3) into A
                    w = j >> 2
                    sp01 = e4m3x2(vsc[vv, 0, w], vsc[vv, 1, w], vsel)
                    sp23 = e4m3x2(vsc[vv, 2, w], vsc[vv, 3, w], vsel)
                    z0 = prmt(vreg[vv, 0, w], vreg[vv, 1, w], 0x5410)  # low halves: nibble j & 3
                    z1 = prmt(vreg[vv, 0, w], vreg[vv, 1, w], 0x7632)  # high halves: nibble (j & 3) + 4
                    z2 = prmt(vreg[vv, 2, w], vreg[vv, 3, w], 0x5410)
                    z3 = prmt(vreg[vv, 2, w], vreg[vv, 3, w], 0x7632)
                    a0 = mul_f16x2(dec_v(z0, j & 3), sp01)
                    a1 = mul_f16x2(dec_v(z1, j & 3), sp01)
                    a2 = mul_f16x2(dec_v(z2, j & 3), sp23)
                    a3 = mul_f16x2(dec_v(z3, j & 3), sp23)
                elif vf == BF16:
                    a0 = prmt(vreg[vv, 0, j], vreg[vv, 1, j], 0x5410)
                    a1 = prmt(vreg[vv, 0, j], vreg[vv, 1, j], 0x7632)
                    a2 = prmt(vreg[vv, 2, j], vreg[vv, 3, j], 0x5410)
                    a3 = prmt(vreg[vv, 2, j], vreg[vv, 3, j], 0x7632)
                else:  # bytes b, b + 1 of word j >> 1 of two tokens: (t0 b, t1 b, t0 b+1, t1 b+1)
                    b = 2 * (j & 1)
                    sel = u32(b | ((4 + b) << 4) | ((b + 1) << 8) | ((5 + b) << 12))
                    z01 = prmt(vreg[vv, 0, j >> 1], vreg[vv, 1, j >> 1], sel)
                    z23 = prmt(vreg[vv, 2, j >> 1], vreg[vv, 3, j >> 1], sel)
                    a0 = dec_i8(z01, 0x5140)
                    a1 = dec_i8(z01, 0x7362)
                    a2 = dec_i8(z23, 0x5140)
                    a3 = dec_i8(z23, 0x7362)
                r0, r1, r2, r3 = mma_v(a0, a1, a2, a3, bb0, bb1, acc[j, 0], acc[j, 1], acc[j, 2], acc[j, 3])
                acc[j, 0] = r0
                acc[j, 1] = r1
                acc[j, 2] = r2
                acc[j, 3] = r3

    @cuda.jit(device=True, inline=True)
    def next_page(table, h, p, p_end):
        """The first page >= p (< p_end) with both K and V allocated: -1 unallocated, <= -2 a cold
        slot (not decoded here yet); p_end if none."""
        while p < p_end and (table[0, h, IX(p)] < 0 or table[1, h, IX(p)] < 0):
            p += 1
        return p

    @cuda.jit(device=True, inline=True)
    def first_chunk(table, h, p_begin, p_end, L, P):
        """(page, K page, V page, valid rows) of the warp's first chunk (page p_end: none)."""
        p = next_page(table, h, p_begin, p_end)
        pk = i64(0)
        pv = i64(0)
        nval = 0
        if p < p_end:
            pk = i64(table[0, h, IX(p)])
            pv = i64(table[1, h, IX(p)])
            nval = min(P, L - p * P)
        return p, pk, pv, nval

    @cuda.jit(device=True, inline=True)
    def next_chunk(table, h, p, c0, pk, pv, nval, p_end, L, P):
        """The chunk after (p, c0): the page's next CH rows, else the next allocated page's first."""
        c1 = c0 + CH
        if c1 >= nval:
            c1 = 0
            p = next_page(table, h, p + 1, p_end)
            if p < p_end:
                pk = i64(table[0, h, IX(p)])
                pv = i64(table[1, h, IX(p)])
                nval = min(P, L - p * P)
        return p, c1, pk, pv, nval

    @cuda.jit(device=True, inline=True)
    def issue(ring, bars, bi, sb, k_words, k_scales, v_words, v_scales, pk, pv, P, c0, nval):
        """(bulk, one lane) The copies of a chunk, rows c0 .. of K page pk and V page pv (whole
        rows up to the page's last valid one; scales rounded up to 16 bytes, still inside the page),
        into the stage at word sb; they land on mbarrier bi."""
        n = min(CH, nval - c0)
        kr = pk * P + c0
        vr = pv * P + c0
        nk = u32(n * (RWK * 4))
        nv = u32(n * (RWV * 4))
        nks = u32((n * (KSR * 4) + 15) & ~15) if SKS else u32(0)
        nvs = u32((n * (VSR * 4) + 15) & ~15) if SVS else u32(0)
        mbar_arrive_tx(bars, bi, nk + nv + nks + nvs)
        bulk_g2s(ring, sb, k_words, kr * RWK, nk, bars, bi)
        bulk_g2s(ring, sb + SKW, v_words, vr * RWV, nv, bars, bi)
        if SKS:
            bulk_g2s(ring, sb + SKW + SVW, k_scales, kr * KSR, nks, bars, bi)
        if SVS:
            bulk_g2s(ring, sb + SKW + SVW + SKS, v_scales, vr * VSR, nvs, bars, bi)

    @cuda.jit(device=True, inline=True)
    def m_st(ring, arr, off, i, x):
        """The block merge's float32 arr[i] = x, or with bulk its bits at the ring's word off + i (reused)."""
        if BULK:
            ring[off + i] = u32(f32_bits(x))
        else:
            arr[i] = x

    @cuda.jit(device=True, inline=True)
    def m_ld(ring, arr, off, i):
        return bits_f32(ring[off + i]) if BULK else arr[i]

    jit = cuda_kernel(max_registers=max_registers)

    @jit
    def attn_mma(q, pos, qscale, P, k_words, k_scales, v_words, v_scales, gscale, table, ws_acc, ws_ml):
        # k_scales/v_scales: 4-bit formats: E4M3 bytes as flat uint32 words (SW per row);
        # int8: float32 per row; bf16: unused.
        if pdl:  # the split merge may be launched now: its blocks start as this grid's blocks exit
            griddep_launch()
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
        kc = KSC / gscale[0, h]

        L = pos0 + t + 1
        npages = (L + P - 1) // P
        nsplit = cuda.gridDim.y * NWARPS
        ppw = ((pos0 + cuda.gridDim.x + P - 1) // P + nsplit - 1) // nsplit
        p_begin = split * ppw
        p_end = min(p_begin + ppw, npages)

        # ---- q as the A operand (rows g = gid, rows 8..15 zero), dims in the order of the K decode
        qsm = cuda.shared.array(QSA, np.uint32)  # (qsmem) [warp, ..., lane]
        qa = qsm[warp] if QS else cuda.local.array(QL, np.uint32)  # [2, NS, lane or 1] | I8: [NS / 2, 4, ...]
        ql = lane if QS else 0
        for s in range(0 if I8 else NS):  # (int8 keys on s8 MMAs take q in int8 parts, below)
            if K4:  # word tig * WPL + (s >> 1): nibbles (a, a + 4) in qa[0], (a + 1, a + 5) in qa[1]
                d0 = 8 * (tig * WPL + (s >> 1)) + 2 * (s & 1)
                d1 = d0 + 4
                d2 = d0 + 1
                d3 = d0 + 5
            elif kf == INT8:  # word tig * NS + s: dims 4 (tig NS + s) + (0, 1 | 2, 3)
                d0 = 4 * (tig * NS + s)
                d1 = d0 + 1
                d2 = d0 + 2
                d3 = d0 + 3
            else:  # bf16: dims 16s + 4tig + (0, 1 | 2, 3)
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
            qa[0, s, ql] = pack_k(x0, x1)
            qa[1, s, ql] = pack_k(x2, x3)

        if I8:
            mq = f32(0.0)
            for g in range(G):
                m = f32(0.0)
                for i in range(lane, D, 32):
                    m = max(m, abs(q[t, hq0 + g, i]))
                for o in range(5):
                    m = max(m, cuda.shfl_xor_sync(0xFFFFFFFF, m, 16 >> o))
                if g == gid:
                    mq = m
            # 2^k (biased exponent eb) with mq * qscale * 2^k < 2^14 (ref_q_int16 is the spec)
            eb = min(max(_Q16_EB - ((f32_bits(mq * qscale) >> 23) & 0xFF), 1), 253)
            q2 = bits_f32(eb << 23)
            kc = bits_f32((254 - eb) << 23)
            for s in range(NS // 2):
                for half in range(2):  # k-slots 4 tig .. (word tig NS + 2 s) | 16 + 4 tig .. (the next word)
                    hi = u32(0)
                    lo = u32(0)
                    if gid < G:
                        d0 = 4 * (tig * NS + 2 * s + half)
                        for i in range(4):
                            v = f32_bits(q[t, hq0 + gid, d0 + i] * qscale * q2 + f32(12582912.0)) - 0x4B400000
                            vh = (v + 128) >> 8  # q16 = 256 vh + vl, vl in [-128, 127]
                            hi |= u32((vh & 0xFF) << (8 * i))
                            lo |= u32(((v - (vh << 8)) & 0xFF) << (8 * i))
                    qa[s, 2 * half, ql] = hi  # A of each k32 step: (hi, lo, hi, lo)
                    qa[s, 2 * half + 1, ql] = lo
        acc = cuda.local.array((NS, 4), np.float32)  # O^T fragments: (row d, col g 2tig | 2tig+1)
        for j in range(NS):
            for i in range(4):
                acc[j, i] = f32(0.0)
        m_run = _NEG_INF  # of row g = gid
        l_run = f32(0.0)  # this lane's share of row gid's sum
        ml = cuda.local.array(4, np.float32)  # (tm) of heads 2tig, 2tig + 1: (m, m', l, l')
        ml[0] = _NEG_INF
        ml[1] = _NEG_INF
        ml[2] = f32(0.0)
        ml[3] = f32(0.0)
        kreg = cuda.local.array((KT, KW), np.uint32)
        ksc = cuda.local.array((KT, 2), np.uint32)
        krs = cuda.local.array((KT, 2), np.float32)
        sv = cuda.local.array((NT, 2), np.float32)
        vreg = cuda.local.array((VT, 4, VW), np.uint32)
        vsc = cuda.local.array((VT, 4, SW), np.uint32)
        vrs = cuda.local.array((VT, 4), np.float32)
        if SIMULATED:  # (the simulator refuses an alignment)
            ring = cuda.shared.array(RING, np.uint32)  # (bulk) [warp, stage, STW words]; the merge reuses it
        else:
            ring = cuda.shared.array(RING, np.uint32, alignment=16)
        bars = cuda.shared.array(NBAR, np.uint64)  # (bulk) [warp, stage]

        if BULK:
            wb = warp * STG  # this warp's stages and their mbarriers
            if lane == 0:
                for st in range(STG):
                    mbar_init(bars, wb + st, 1)
                mbar_fence_init()
            cuda.syncwarp()
            p, pk, pv, nval = first_chunk(table, h, p_begin, p_end, L, P)
            if p < p_end and lane == 0:
                issue(ring, bars, wb, wb * STW, k_words, k_scales, v_words, v_scales, pk, pv, P, 0, nval)
            c0 = 0
            it = 0
            while p < p_end:  # (p, c0) the chunk of stage it & 1, (p1, c1) the next one
                p1, c1, pk1, pv1, nval1 = next_chunk(table, h, p, c0, pk, pv, nval, p_end, L, P)
                if p1 < p_end:
                    cuda.syncwarp()  # every lane is done with the stage the next chunk overwrites
                    if lane == 0:
                        b1 = wb + ((it + 1) & 1)
                        issue(ring, bars, b1, b1 * STW, k_words, k_scales, v_words, v_scales, pk1, pv1, P, c1,
                              nval1)
                b0 = wb + (it & 1)
                sb = b0 * STW
                mbar_wait(bars, b0, (it >> 1) & 1)
                if not STREAM:
                    load_k(ring, ring, kreg, ksc, krs, -c0, c0, nval - 1, tig, gid, sb, sb + SKW + SVW, 0)
                k_phase(qa, kreg, ksc, krs, sv, kc, c0, nval, tig, gid, ql, ring, sb)
                if not STREAM:
                    load_v(ring, ring, vreg, vsc, vrs, -c0, c0, nval - 1, tig, gid, sb + SKW, sb + SKW + SVW + SKS, 0)
                m_run, l_run = softmax_pv(sv, vreg, vsc, vrs, acc, m_run, l_run, ml, tig, gid, ring, sb, c0,
                                          nval - 1)
                p, c0, pk, pv, nval = p1, c1, pk1, pv1, nval1
                it += 1
            cuda.syncthreads()  # every warp is done with its ring: the merge below reuses it
        elif PIPE:
            # Software-pipelined: a chunk's K words are loaded while the previous chunk's softmax and
            # V product run, its V words while its own K product runs (each into registers the
            # previous use just freed), so a warp's own work covers its load latency.
            p, pk, pv, nval = first_chunk(table, h, p_begin, p_end, L, P)
            if p < p_end:
                load_k(k_words, k_scales, kreg, ksc, krs, pk * P, 0, nval - 1, tig, gid, 0, 0, 0)
                load_v(v_words, v_scales, vreg, vsc, vrs, pv * P, 0, nval - 1, tig, gid, 0, 0, 0)
            c0 = 0
            while p < p_end:  # (p, c0) the chunk in registers, (p1, c1) the next one
                k_phase(qa, kreg, ksc, krs, sv, kc, c0, nval, tig, gid, ql, ring, 0)
                p1, c1, pk1, pv1, nval1 = next_chunk(table, h, p, c0, pk, pv, nval, p_end, L, P)
                if p1 < p_end:
                    load_k(k_words, k_scales, kreg, ksc, krs, pk1 * P, c1, nval1 - 1, tig, gid, 0, 0, 0)
                m_run, l_run = softmax_pv(sv, vreg, vsc, vrs, acc, m_run, l_run, ml, tig, gid, ring, 0, c0, 0)
                if p1 < p_end:
                    load_v(v_words, v_scales, vreg, vsc, vrs, pv1 * P, c1, nval1 - 1, tig, gid, 0, 0, 0)
                p, c0, pk, pv, nval = p1, c1, pk1, pv1, nval1
        else:
            for p in range(p_begin, p_end):
                pk = i64(table[0, h, IX(p)])
                pv = i64(table[1, h, IX(p)])
                if pk < 0 or pv < 0:
                    continue  # -1 unallocated; <= -2 cold slot (not decoded here yet)
                nval = min(P, L - p * P)
                for c0 in range(0, nval, CH):
                    load_k(k_words, k_scales, kreg, ksc, krs, pk * P, c0, nval - 1, tig, gid, 0, 0, 0)
                    k_phase(qa, kreg, ksc, krs, sv, kc, c0, nval, tig, gid, ql, ring, 0)
                    load_v(v_words, v_scales, vreg, vsc, vrs, pv * P, c0, nval - 1, tig, gid, 0, 0, 0)
                    m_run, l_run = softmax_pv(sv, vreg, vsc, vrs, acc, m_run, l_run, ml, tig, gid, ring, 0, c0, 0)

        # ---------------- the block's partial: the NWARPS warps' (m, l, acc) merged in shared
        # memory, so the workspace holds one split per block (4x fewer for the reduce kernel)
        sm_acc = cuda.shared.array(SMA_, np.float32)  # [warp, g, d]
        sm_ml = cuda.shared.array(SMM_, np.float32)  # [warp, g, (m, l)]
        if TM:
            m_run, l_run = tm_rows(ml, tig, gid)
        l_run += cuda.shfl_xor_sync(0xFFFFFFFF, l_run, 1)
        l_run += cuda.shfl_xor_sync(0xFFFFFFFF, l_run, 2)
        vc = f32(1.0)
        if V4:
            vc = VSC / gscale[1, h]
        for j in range(NS):
            if V4:
                dr = 8 * (gid + 8 * (j >> 2)) + (j & 3)
                dr8 = dr + 4
            elif vf == BF16:
                dr = 16 * j + 2 * gid
                dr8 = dr + 1
            else:
                dr = (D // 8) * gid + 2 * j
                dr8 = dr + 1
            for i in range(2):
                g = 2 * tig + i
                if g < G:
                    m_st(ring, sm_acc, 0, (warp * G + g) * D + dr, acc[j, i] * vc)
                    m_st(ring, sm_acc, 0, (warp * G + g) * D + dr8, acc[j, 2 + i] * vc)
        if tig == 0 and gid < G:
            m_st(ring, sm_ml, SMA, 2 * (warp * G + gid), m_run)
            m_st(ring, sm_ml, SMA, 2 * (warp * G + gid) + 1, l_run)
        cuda.syncthreads()
        for e in range(tid, G * D, THREADS):
            g = e // D
            d = e - g * D
            M = _NEG_INF
            for w in range(NWARPS):
                M = max(M, m_ld(ring, sm_ml, SMA, 2 * (w * G + g)))
            num = f32(0.0)
            den = f32(0.0)
            for w in range(NWARPS):
                mw = m_ld(ring, sm_ml, SMA, 2 * (w * G + g))
                if mw > _NEG_INF:  # -inf: a warp without pages (its l and acc are 0)
                    f = math.exp2(mw - M)
                    num += f * m_ld(ring, sm_acc, 0, (w * G + g) * D + d)
                    den += f * m_ld(ring, sm_ml, SMA, 2 * (w * G + g) + 1)
            ws_acc[blk, t, hq0 + g, d] = num
            if d == 0:
                ws_ml[blk, t, hq0 + g, 0] = M
                ws_ml[blk, t, hq0 + g, 1] = den

    return attn_mma


_KERNELS: dict = {}


def get_kernel(kf: int, vf: int, G: int, D: int, devpos: bool = False, nt: int = 0, max_registers=None,
               u64: bool = True, pipe: bool = False, k8: bool = False, qsmem: bool = False, bulk: bool = False,
               tm: bool = False, pdl: bool = False):
    key = (int(kf), int(vf), int(G), int(D), bool(devpos), int(nt), max_registers, bool(u64), bool(pipe), bool(k8),
           bool(qsmem), bool(bulk), bool(tm), bool(pdl))
    if key not in _KERNELS:
        if not supports(kf, vf, G, D):
            raise ValueError(f"attention_mma: unsupported K={kf} V={vf} G={G} D={D}")
        if bulk and not supports_bulk(kf, vf, G, D, nt, qsmem):
            raise ValueError(f"attention_mma: no bulk ring for K={kf} V={vf} G={G} D={D} (shared memory)")
        _KERNELS[key] = _build(*key)
    return _KERNELS[key]


_SCALE_T = {BF16: "uint8", INT8: "float32", NVFP4: "uint32", ISO3: "uint32"}


def kernel_sig(kf, vf, devpos=False):
    return attention_cuda.kernel_sig(kf, vf, devpos, _SCALE_T)


def _ptx_signatures() -> tuple[list, list]:
    """(CI's list: each format at the main shape, the runtime's device-position builds
    (`_MMA_TUNED`'s: int8 q in shared memory, nvfp4 the bulk ring with tokens on the rows), the
    other lane layouts and shapes; the rest, run with -m slow: benchmark variants and more
    shapes)."""
    fm = [BF16, INT8, NVFP4, ISO3]
    out = [(get_kernel(f, f, 4, 128), kernel_sig(f, f)) for f in fm]
    out += [(get_kernel(NVFP4, ISO3, 4, 128), kernel_sig(NVFP4, ISO3)),
            (get_kernel(NVFP4, NVFP4, 6, 256), kernel_sig(NVFP4, NVFP4)),
            (get_kernel(INT8, BF16, 1, 64), kernel_sig(INT8, BF16)),
            (get_kernel(NVFP4, NVFP4, 4, 128, True), kernel_sig(NVFP4, NVFP4, True)),
            (get_kernel(ISO3, INT8, 2, 64, True), kernel_sig(ISO3, INT8, True)),
            (get_kernel(NVFP4, ISO3, 3, 192), kernel_sig(NVFP4, ISO3)),
            (get_kernel(BF16, BF16, 4, 128, True, pipe=True), kernel_sig(BF16, BF16, True)),
            (get_kernel(INT8, INT8, 4, 128, True, max_registers=128, k8=True, qsmem=True),
             kernel_sig(INT8, INT8, True)),
            (get_kernel(NVFP4, NVFP4, 4, 128, True, max_registers=128, bulk=True, tm=True),
             kernel_sig(NVFP4, NVFP4, True))]
    more = [(get_kernel(NVFP4, NVFP4, 4, 128, True, bulk=True, tm=True, pdl=True), kernel_sig(NVFP4, NVFP4, True)),
            (get_kernel(INT8, NVFP4, 4, 128, u64=False), kernel_sig(INT8, NVFP4)),
            (get_kernel(BF16, ISO3, 6, 256), kernel_sig(BF16, ISO3)),
            (get_kernel(INT8, INT8, 4, 128, True, k8=True), kernel_sig(INT8, INT8, True)),
            (get_kernel(INT8, NVFP4, 8, 64, k8=True), kernel_sig(INT8, NVFP4)),
            (get_kernel(INT8, INT8, 4, 128, True, max_registers=96, k8=True, qsmem=True), kernel_sig(INT8, INT8, True)),
            (get_kernel(NVFP4, NVFP4, 4, 128, True, max_registers=128, bulk=True), kernel_sig(NVFP4, NVFP4, True)),
            (get_kernel(INT8, ISO3, 2, 64, bulk=True, k8=True), kernel_sig(INT8, ISO3)),
            (get_kernel(BF16, ISO3, 6, 64, nt=4, tm=True), kernel_sig(BF16, ISO3))]
    return out, more


PTX_SIGNATURES, PTX_SIGNATURES_MORE = _ptx_signatures()
