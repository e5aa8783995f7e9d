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

The kernel runs only on a GPU (the CUDA simulator cannot execute inline PTX); attention_cuda's
FMA kernel stays the simulator / reference path.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.extending import intrinsic

from coldkv.numba_kernels import attention_cuda
from coldkv.numba_kernels.attention_cuda import _pos_dev, _pos_int
from coldkv.numba_kernels.quant import BF16, INT8, ISO3, NVFP4, ref_e4m3_decode

NWARPS = 4
THREADS = 32 * NWARPS
_LAZY = np.float32(8.0)
_NEG_INF = np.float32(-np.inf)
_E4M3_TAB = ref_e4m3_decode(np.arange(256, dtype=np.uint8)).astype(np.float32)
_VPW = {BF16: 2, INT8: 4, NVFP4: 8, ISO3: 8}


# ------------------------------------------------------------------------------ inline PTX
def _asm(ptx: str, constraints: str, ret, args):
    """A Numba intrinsic emitting one inline-PTX block with a fixed signature (arguments are cast
    to `args`; a tuple `ret` is a multi-output asm)."""
    names = ", ".join(f"a{i}" for i in range(len(args)))

    def codegen(context, builder, sig, llargs):
        lt = [context.get_value_type(t) for t in args]
        tup = isinstance(ret, types.BaseTuple)
        rt = ir.LiteralStructType([context.get_value_type(t) for t in ret.types]) if tup else context.get_value_type(ret)
        r = builder.call(ir.InlineAsm(ir.FunctionType(rt, lt), ptx, constraints, side_effect=False), list(llargs))
        if tup:
            return context.make_tuple(builder, ret, [builder.extract_value(r, i) for i in range(len(ret.types))])
        return r

    ns = {"ret": ret, "args": args, "codegen": codegen}
    exec(f"def f(typingctx, {names}):\n    return ret(*args), codegen\n", ns)
    return intrinsic(ns["f"])


_u32, _f32 = types.uint32, types.float32
_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.{0}.{0}.f32 {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};"
_MMA_C = "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"
mma_f16 = _asm(_MMA.format("f16"), _MMA_C, types.UniTuple(_f32, 4), (_u32,) * 6 + (_f32,) * 4)
mma_bf16 = _asm(_MMA.format("bf16"), _MMA_C, types.UniTuple(_f32, 4), (_u32,) * 6 + (_f32,) * 4)
prmt = _asm("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", _u32, (_u32, _u32, _u32))
# cvt.rn.{f16,bf16}x2.f32 d, a, b puts a in the upper half: pack(lo, hi)
pack_f16 = _asm("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", _u32, (_f32, _f32))
pack_bf16 = _asm("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", _u32, (_f32, _f32))
# two E2M1 nibbles at bits sh..sh+3 and 16+sh.. of x -> fp16x2 of the values: the bits
# (s << 15) | (eem << 9) are value * 2^-14 (0.5 is an fp16 subnormal there), times 2^14 (exact)
# so the tensor-core operands are normal numbers.
dec_e2m1 = _asm("{.reg .b32 y, a, b, k;\n mov.b32 k, 0x74007400;\n shr.b32 y, $1, $2;\n shl.b32 a, y, 9;\n"
                " shl.b32 b, y, 12;\n and.b32 a, a, 0x0E000E00;\n and.b32 b, b, 0x80008000;\n or.b32 a, a, b;\n"
                " mul.rn.f16x2 $0, a, k;}",
                "=r,r,r", _u32, (_u32, _u32))
# two ISO3 nibbles (sign bit 3, magnitude 0..7) -> fp16x2 of the integer values
dec_iso3 = _asm("{.reg .b32 y, a, b, m;\n mov.b32 m, 0x64006400;\n shr.b32 y, $1, $2;\n and.b32 a, y, 0x00070007;\n"
                " or.b32 a, a, m;\n sub.f16x2 a, a, m;\n shl.b32 b, y, 12;\n and.b32 b, b, 0x80008000;\n or.b32 $0, a, b;}",
                "=r,r,r", _u32, (_u32, _u32))
# bytes of x picked by the byte_perm selector (two of them, as (b, 0x64, b', 0x64)) -> fp16x2 of
# the signed int8 values; x must already be xor-ed with 0x80808080
dec_i8 = _asm("{.reg .b32 a, m, c;\n mov.b32 m, 0x64646464;\n mov.b32 c, 0x64806480;\n prmt.b32 a, $1, m, $2;\n"
              " sub.f16x2 $0, a, c;}",
              "=r,r,r", _u32, (_u32, _u32))


# two E4M3 bytes (byte sel & 7 of {b, a} -> low, (sel >> 4) & 7 -> high, as prmt picks them) ->
# fp16x2 (exact: every E4M3 value is a normal fp16); cvt keeps the byte order (low byte -> low half)
e4m3x2 = _asm("{.reg .b32 t;\n .reg .b16 lo, hi;\n prmt.b32 t, $1, $2, $3;\n mov.b32 {lo, hi}, t;\n"
              " cvt.rn.f16x2.e4m3x2 $0, lo;}",
              "=r,r,r,r", _u32, (_u32, _u32, _u32))
mul_f16x2 = _asm("mul.rn.f16x2 $0, $1, $2;", "=r,r,r", _u32, (_u32, _u32))


def _ldg(n):
    """n consecutive 32-bit words arr[i .. i+n) in one ld.global.nc.v{n} (i * 4 bytes aligned to n * 4)."""
    outs = ",".join("$%d" % i for i in range(n))
    ptx = f"ld.global.nc.v{n}.u32 {{{outs}}}, [${n}];" if n > 1 else "ld.global.nc.u32 $0, [$1];"
    cons = ",".join(["=r"] * n) + ",l"

    @intrinsic
    def ldg(typingctx, arr, idx):
        ret = types.UniTuple(_u32, n) if n > 1 else _u32

        def codegen(context, builder, sig, args):
            a = context.make_array(sig.args[0])(context, builder, args[0])
            i64 = ir.IntType(64)
            ptr = builder.gep(a.data, [context.cast(builder, args[1], sig.args[1], types.int64)])
            rt = ir.LiteralStructType([ir.IntType(32)] * n) if n > 1 else ir.IntType(32)
            r = builder.call(ir.InlineAsm(ir.FunctionType(rt, [i64]), ptx, cons, side_effect=False),
                             [builder.ptrtoint(ptr, i64)])
            if n > 1:
                return context.make_tuple(builder, ret, [builder.extract_value(r, k) for k in range(n)])
            return r

        return ret(arr, idx), codegen

    return ldg


ldg2 = _ldg(2)
ldg4 = _ldg(4)


# ------------------------------------------------------------------------------ simulator
# The CUDA simulator cannot run inline PTX. Under it the primitives above are replaced by Python
# emulations written from the PTX ISA's definitions (mma.m16n8k16 fragment layouts, prmt byte
# selection, the asm blocks' bit operations, fp16/bf16 round-to-nearest-even), so the kernels'
# index logic runs in the simulator on small shapes (tests/test_attention_cuda.py). What it cannot
# show: hardware scheduling, and a misreading of the ISA shared by a kernel and its emulation;
# the gpu tests check the kernels on the device.
def _sim_f16(bits):
    return float(np.array(bits & 0xFFFF, np.uint16).view(np.float16))


def _sim_bf16(bits):
    return float(np.array((bits & 0xFFFF) << 16, np.uint32).view(np.float32))


def _sim_to_f16(x):
    return int(np.array(x, np.float32).astype(np.float16).view(np.uint16))


def _sim_to_bf16(x):
    b = int(np.array(x, np.float32).view(np.uint32))
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def _sim_halves(x):
    x = int(x)
    return x & 0xFFFF, (x >> 16) & 0xFFFF


def _sim_f16x2(f, a, b):
    """Elementwise fp16 op f on two f16x2 words (one rounding: the exact result of + - * of two
    fp16 values fits in float32)."""
    (a0, a1), (b0, b1) = _sim_halves(a), _sim_halves(b)
    r = [_sim_to_f16(np.float32(f(np.float32(_sim_f16(x)), np.float32(_sim_f16(y))))) for x, y in ((a0, b0), (a1, b1))]
    return np.uint32(r[0] | (r[1] << 16))


def _sim_prmt(a, b, sel):
    src = int(a) | (int(b) << 32)
    r = 0
    for k in range(4):
        n = (int(sel) >> (4 * k)) & 7
        r |= ((src >> (8 * n)) & 0xFF) << (8 * k)
    return np.uint32(r)


def _sim_pack_f16(lo, hi):
    return np.uint32(_sim_to_f16(lo) | (_sim_to_f16(hi) << 16))


def _sim_pack_bf16(lo, hi):
    return np.uint32(_sim_to_bf16(lo) | (_sim_to_bf16(hi) << 16))


def _sim_dec_e2m1(x, sh):
    y = (int(x) >> int(sh)) & 0xFFFFFFFF
    a = ((y << 9) & 0x0E000E00) | ((y << 12) & 0x80008000)
    return _sim_f16x2(lambda u, v: u * v, a, 0x74007400)


def _sim_dec_iso3(x, sh):
    y = (int(x) >> int(sh)) & 0xFFFFFFFF
    a = int(_sim_f16x2(lambda u, v: u - v, (y & 0x00070007) | 0x64006400, 0x64006400))
    return np.uint32(a | ((y << 12) & 0x80008000))


def _sim_dec_i8(x, sel):
    return _sim_f16x2(lambda u, v: u - v, _sim_prmt(x, 0x64646464, sel), 0x64806480)


def _sim_e4m3x2(a, b, sel):
    t = int(_sim_prmt(a, b, sel))
    return np.uint32(_sim_to_f16(_E4M3_TAB[t & 0xFF]) | (_sim_to_f16(_E4M3_TAB[(t >> 8) & 0xFF]) << 16))


def _sim_mul_f16x2(a, b):
    return _sim_f16x2(lambda u, v: u * v, a, b)


_sim_lock = None


def _sim_allgather(value):
    """Every lane of the calling simulator thread's warp publishes `value`; returns all 32 (the
    simulator runs each CUDA thread as a Python thread; a barrier per (block, warp))."""
    import threading

    global _sim_lock
    if _sim_lock is None:
        _sim_lock = threading.Lock()
    t = threading.current_thread()
    manager = t._manager
    bx, by, bz = manager._block_dim
    warp = t.thread_id // 32
    key = (tuple(t.blockIdx), warp)
    with _sim_lock:
        table = manager.__dict__.setdefault("_coldkv_mma_warps", {})
        st = table.get(key)
        if st is None:
            st = table[key] = (threading.Barrier(min(32, bx * by * bz - 32 * warp), timeout=120.0), [None] * 32)
    barrier, vals = st
    vals[t.thread_id % 32] = value
    barrier.wait()
    out = list(vals)
    barrier.wait()
    return out, t.thread_id % 32


def _sim_mma(conv):
    def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """mma.sync.aligned.m16n8k16.row.col.f32: lane (gid, tig) holds A (row gid | gid + 8,
        cols 2 tig, 2 tig + 1 | + 8), B (k rows 2 tig, 2 tig + 1 | + 8, col gid), C (rows gid |
        gid + 8, cols 2 tig, 2 tig + 1); low half = the lower column / k."""
        frags, lane = _sim_allgather((a0, a1, a2, a3, b0, b1))
        A = np.zeros((16, 16))
        B = np.zeros((16, 8))
        for ln, (x0, x1, x2, x3, y0, y1) in enumerate(frags):
            g, t = ln >> 2, ln & 3
            for (r, c), w in (((g, 2 * t), x0), ((g + 8, 2 * t), x1), ((g, 2 * t + 8), x2), ((g + 8, 2 * t + 8), x3)):
                A[r, c], A[r, c + 1] = conv(int(w)), conv(int(w) >> 16)
            for k, w in ((2 * t, y0), (2 * t + 8, y1)):
                B[k, g], B[k + 1, g] = conv(int(w)), conv(int(w) >> 16)
        g, t = lane >> 2, lane & 3
        D = A @ B
        return (np.float32(D[g, 2 * t] + c0), np.float32(D[g, 2 * t + 1] + c1),
                np.float32(D[g + 8, 2 * t] + c2), np.float32(D[g + 8, 2 * t + 1] + c3))
    return mma


def _sim_ldg(n):
    def ldg(arr, idx):
        i = int(idx)
        return tuple(np.uint32(arr[i + k]) for k in range(n)) if n > 1 else np.uint32(arr[i])
    return ldg


def _sim_install():
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    if not hasattr(FakeCUDAModule, "any_sync"):  # the decode / rows kernels' warp vote
        FakeCUDAModule.any_sync = lambda self, mask, pred: self.ballot_sync(mask, pred) != 0


from numba import config as _config  # noqa: E402

SIMULATED = bool(_config.ENABLE_CUDASIM)
if SIMULATED:
    mma_f16, mma_bf16 = _sim_mma(_sim_f16), _sim_mma(_sim_bf16)
    prmt, pack_f16, pack_bf16 = _sim_prmt, _sim_pack_f16, _sim_pack_bf16
    dec_e2m1, dec_iso3, dec_i8 = _sim_dec_e2m1, _sim_dec_iso3, _sim_dec_i8
    e4m3x2, mul_f16x2 = _sim_e4m3x2, _sim_mul_f16x2
    ldg2, ldg4 = _sim_ldg(2), _sim_ldg(4)


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
            cuda.syncthreads()  # (also: every warp is done with the previous chunk)
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


def prefill_tokens_per_block(G: int, mt: int = 1) -> int:
    return NWARPS * mt * (16 // G)


_KERNELS: dict = {}
_PREFILL: dict = {}


def get_prefill_kernel(kf: int, vf: int, G: int, D: int, devpos: bool = False, mt: int = 1, max_registers=None,
                       smem: bool = False, warps: int = 4, chb: int = 0):
    """The prefill kernel: `_build_prefill` (per-warp decode, `mt` m-tiles a warp) or, smem=True,
    `_build_prefill_smem` (decode shared by the `warps` warps of a block, chunks of `chb` keys)."""
    key = (int(kf), int(vf), int(G), int(D), bool(devpos), int(mt), max_registers, bool(smem), int(warps), int(chb))
    if key not in _PREFILL:
        if not supports(kf, vf, G, D):
            raise ValueError(f"attention_mma: unsupported K={kf} V={vf} G={G} D={D}")
        if smem:
            _PREFILL[key] = _build_prefill_smem(kf, vf, G, D, devpos, warps, chb, max_registers)
        else:
            _PREFILL[key] = _build_prefill(kf, vf, G, D, devpos, mt, max_registers)
    return _PREFILL[key]


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
    return out


PTX_SIGNATURES = _ptx_signatures()
