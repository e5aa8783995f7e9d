"""Inline-PTX primitives of the tensor-core attention kernels, and their simulator emulations.

Numba has no WMMA API, so `mma.sync.aligned.m16n8k16`, `prmt`, the code -> fp16x2 decoders and
the vector loads are inline PTX through llvmlite (`_asm`, `_ldg`). The CUDA simulator cannot run
PTX; under it each primitive is replaced by a Python emulation written from the PTX ISA's
definitions, so the kernels of attention_mma.py / attention_prefill.py run in CI (logic only).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.extending import intrinsic

from coldkv.numba_kernels.fp import e4m3_dec
from coldkv.numba_kernels.ptx import asm as _asm, prmt, sim_prmt as _sim_prmt  # noqa: F401 (prmt: re-exported)

# E4M3 byte -> float32 for the simulator's emulations (fp.e4m3_dec is tested against the reference;
# not imported from quant.py, which imports ptx.py as this module does)
_E4M3_TAB = np.array([e4m3_dec(b) for b in range(256)], np.float32)


# ------------------------------------------------------------------------------ inline PTX
_u32, _f32 = types.uint32, types.float32
_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.{0}.{0}.f32 {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};"
_MMA_C = "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"
mma_f16 = _asm(_MMA.format("f16"), _MMA_C, types.UniTuple(_f32, 4), (_u32,) * 6 + (_f32,) * 4)
mma_bf16 = _asm(_MMA.format("bf16"), _MMA_C, types.UniTuple(_f32, 4), (_u32,) * 6 + (_f32,) * 4)
# m16n8k32 with s8 A and B, s32 accumulation: each register holds 4 bytes, A (row gid | gid + 8,
# k 4 tig .. + 3 | + 16), B (k 4 tig .. + 3 | + 16, col gid), C as m16n8k16's (native IMMA on sm_90;
# its fp8 sibling .e4m3 is not: ptxas 13.0 unpacks E4M3 to fp16 and runs HMMAs there)
mma_s8 = _asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
              "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r", types.UniTuple(types.int32, 4), (_u32,) * 6 + (types.int32,) * 4)
# cvt.rn.{f16,bf16}x2.f32 d, a, b puts a in the upper half: pack(lo, hi)
pack_f16 = _asm("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", _u32, (_f32, _f32))
pack_bf16 = _asm("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", _u32, (_f32, _f32))
# ISO3: the 8 codes of a word at once: fp16x2 pairs (nibble i, nibble i + 4), i = 0..3. Every
# 4-bit magnitude is an fp16 whose low byte is 0, so two PRMTs look up the high bytes of all 8
# magnitudes in an 8-byte table, four more place them (selector nibble 8: the sign of a table
# byte < 0x80, i.e. 0x00, for the low bytes) and the sign bits are or-ed in: ~19 instructions per
# 8 values. (E2M1 needs no table: dec4_e2m1 below, 11.)
def _dec8(tlo, thi):
    ptx = ("{.reg .b32 tl, th, m0, m1, s;\n"
           f" mov.b32 tl, {tlo:#x};\n mov.b32 th, {thi:#x};\n"
           " and.b32 m0, $4, 0x7777;\n shr.b32 m1, $4, 16;\n and.b32 m1, m1, 0x7777;\n"
           " prmt.b32 m0, tl, th, m0;\n prmt.b32 m1, tl, th, m1;\n"
           " prmt.b32 $0, m0, m1, 0x4808;\n prmt.b32 $1, m0, m1, 0x5818;\n"
           " prmt.b32 $2, m0, m1, 0x6828;\n prmt.b32 $3, m0, m1, 0x7838;\n"
           " shl.b32 s, $4, 12;\n and.b32 s, s, 0x80008000;\n or.b32 $0, $0, s;\n"
           " shl.b32 s, $4, 8;\n and.b32 s, s, 0x80008000;\n or.b32 $1, $1, s;\n"
           " shl.b32 s, $4, 4;\n and.b32 s, s, 0x80008000;\n or.b32 $2, $2, s;\n"
           " and.b32 s, $4, 0x80008000;\n or.b32 $3, $3, s;}")
    return _asm(ptx, "=r,=r,=r,=r,r", types.UniTuple(_u32, 4), (_u32,))


_DEC8_ISO3 = (0x42403C00, 0x47464544)  # fp16 high bytes of 0, 1, 2, 3 | 4, 5, 6, 7
dec8_iso3 = _dec8(*_DEC8_ISO3)


# E2M1 nibble s|eem -> fp16 bits (s << 15) | (eem << 9) = value * 2^-14 (0.5 an fp16 subnormal).
# Times any E4M3 scale the product is exact in fp16 ((2 value) (scale's integer significand) 2^-24
# and up: at most 180 ulps of 2^-24 at the bottom, 0.17 at the top), so the kernels undo the 2^-14
# on their fp32 results. Nibbles a, a + 4 of a word are the low (a even) or high nibbles of bytes
# a >> 1 and (a >> 1) + 2, so a word's four pairs share two words of fp16 high bytes and take one
# PRMT each: 11 instructions a word (a shift-and-mask pair per field of each pair was 15; ISO3's
# table lookup, dec8_iso3, 19). Written as Numba bit operations (not asm), so LLVM folds the
# constant shifts and ptxas the masks into LOP3s.
@cuda.jit(device=True, inline=True)
def e2m1_hi_bytes(x, odd):
    """The fp16 high bytes (s << 7) | (eem << 1) of the low (odd = 0) or high (odd = 1) nibbles of
    x's four bytes, in their bytes."""
    if odd:
        return ((x >> 3) & 0x0E0E0E0E) | (x & 0x80808080)
    return ((x << 1) & 0x0E0E0E0E) | ((x << 4) & 0x80808080)


@cuda.jit(device=True, inline=True)
def e2m1_pair(x, a):
    """fp16x2 bits of E2M1 nibbles a (low half) and a + 4 (high half) of x, times 2^-14 (a constant
    after unrolling)."""
    # bytes 0, 2 (a < 2) or 1, 3 -> 1, 3, zeros below (selector nibble 4: a byte of the zero word).
    # A PRMT, not h & 0xFF00FF00, for bytes 1, 3: LLVM pushes that mask into e2m1_hi_bytes' two
    # and recomputes them (3 instructions instead of 1).
    return prmt(np.uint32(e2m1_hi_bytes(x, a & 1)), np.uint32(0), np.uint32(0x2404 if a < 2 else 0x3414))


@cuda.jit(device=True, inline=True)
def dec4_e2m1(x):
    """The four pairs of a word (e2m1_pair a = 0..3), as dec8_iso3 gives ISO3's."""
    return e2m1_pair(x, 0), e2m1_pair(x, 1), e2m1_pair(x, 2), e2m1_pair(x, 3)


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
# an 8x8 matrix of 16-bit values, lane (gid, tig) holding row gid, cols 2 tig, 2 tig + 1 (low half
# first: an MMA accumulator's layout, packed), transposed across the warp into the same layout
movm_t = _asm("movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", "=r,r", _u32, (_u32,))
# 2^x in one MUFU.EX2: math.exp2 is ex2.approx.f32 without .ftz, which ptxas widens to ~6
# instructions (a range test and two multiplies) to produce subnormal results; a softmax
# weight below 2^-126 of the row's max is 0 here instead.
ex2 = _asm("ex2.approx.ftz.f32 $0, $1;", "=f,f", _f32, (_f32,))


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


# ---- shared memory: ldmatrix, cp.async, vector stores (the "fa" prefill kernel). Addresses are
# (array, 32-bit word index) pairs; the shared address is the element pointer cast to the shared
# space (addrspace 3). All are volatile with a memory clobber: LLVM must not move them across a
# barrier or another shared access (ptxas still schedules them by their dependencies).
def _smem_ptr(context, builder, aty, arr, idx):
    """The 32-bit shared address of arr[idx], as base + (idx << log2 itemsize) in 32-bit
    arithmetic: LLVM then folds a constant part of idx into the instruction's immediate offset
    (ldmatrix [r + imm]) instead of redoing a 64-bit generic address per access."""
    a = context.make_array(aty)(context, builder, arr)
    data = a.data
    sp = builder.addrspacecast(data, ir.PointerType(data.type.pointee, 3) if hasattr(data.type, "pointee")
                               and not getattr(data.type, "is_opaque", False) else ir.PointerType(addrspace=3))
    i32 = ir.IntType(32)
    shift = int(np.log2(context.get_abi_sizeof(context.get_data_type(aty.dtype))))
    return builder.add(builder.ptrtoint(sp, i32), builder.shl(idx, ir.Constant(i32, shift)))


def _ldsm(trans):
    """ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the row address
    arr[idx] (16 bytes: a word index multiple of 4) of row l % 8 of matrix l // 8; result j is
    matrix j's (row l // 4, halves 2 (l % 4), + 1), with .trans the transposed matrix's."""
    ptx = (f"ldmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.shared.b16 "
           "{$0, $1, $2, $3}, [$4];")

    @intrinsic
    def ldsm(typingctx, arr, idx):
        ret = types.UniTuple(_u32, 4)

        def codegen(context, builder, sig, args):
            addr = _smem_ptr(context, builder, sig.args[0], args[0],
                             context.cast(builder, args[1], sig.args[1], types.uint32))
            rt = ir.LiteralStructType([ir.IntType(32)] * 4)
            r = builder.call(ir.InlineAsm(ir.FunctionType(rt, [ir.IntType(32)]), ptx, "=r,=r,=r,=r,r,~{memory}",
                                          side_effect=True), [addr])
            return context.make_tuple(builder, ret, [builder.extract_value(r, k) for k in range(4)])

        return ret(arr, idx), codegen

    return ldsm


ldsm_x4 = _ldsm(False)
ldsm_x4_t = _ldsm(True)


@intrinsic
def sts4(typingctx, arr, idx, a, b, c, d):
    """st.shared.v4.u32 of a, b, c, d at arr[idx .. idx + 4) (idx a multiple of 4)."""
    def codegen(context, builder, sig, args):
        addr = _smem_ptr(context, builder, sig.args[0], args[0],
                         context.cast(builder, args[1], sig.args[1], types.uint32))
        vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[2:], sig.args[2:])]
        builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ir.IntType(32)] * 5),
                                  "st.shared.v4.u32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r,~{memory}",
                                  side_effect=True), [addr] + vals)
        return context.get_dummy_value()

    return types.none(arr, idx, a, b, c, d), codegen


@intrinsic
def cp_async16_zfill(typingctx, sarr, sidx, garr, gidx, nbytes):
    """cp.async.cg.shared.global: 16 bytes garr[gidx .. + 4) (32-bit words) -> sarr[sidx .. + 4);
    only the first `nbytes` (0 or 16) are read, the rest is zero-filled."""
    def codegen(context, builder, sig, args):
        addr = _smem_ptr(context, builder, sig.args[0], args[0],
                         context.cast(builder, args[1], sig.args[1], types.uint32))
        g = context.make_array(sig.args[2])(context, builder, args[2])
        gp = builder.gep(g.data, [context.cast(builder, args[3], sig.args[3], types.int64)])
        n = context.cast(builder, args[4], sig.args[4], types.uint32)
        i64 = ir.IntType(64)
        builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ir.IntType(32), i64, ir.IntType(32)]),
                                  "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}",
                                  side_effect=True), [addr, builder.ptrtoint(gp, i64), n])
        return context.get_dummy_value()

    return types.none(sarr, sidx, garr, gidx, nbytes), codegen


def _asm_void(ptx):
    """An intrinsic f() emitting `ptx`: no operands, no result (volatile, memory clobber)."""
    @intrinsic
    def f(typingctx):
        def codegen(context, builder, sig, args):
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), ptx, "~{memory}", side_effect=True), [])
            return context.get_dummy_value()

        return types.void(), codegen

    return f


cp_async_wait_all = _asm_void("cp.async.wait_all;")  # commit + wait for every cp.async of the thread


def _cp_async(nbytes):
    """cp.async of nbytes (4 or 16: 1 or 4 words of 4 bytes) from global src[si..] to shared
    dst[di..] (element indices; both 4-byte dtypes, the addresses aligned to nbytes). The copy
    lands asynchronously: visible to this thread after cp_async_wait, to the warp after a syncwarp."""
    kind = "cg" if nbytes == 16 else "ca"  # .cg (L2 only) exists for 16 bytes only
    ptx = ("{ .reg .u64 t; .reg .u32 d; cvta.to.shared.u64 t, $0; cvt.u32.u64 d, t; "
           f"cp.async.{kind}.shared.global [d], [$1], {nbytes}; }}")

    @intrinsic
    def cp(typingctx, dst, di, src, si):
        def codegen(context, builder, sig, args):
            i64 = ir.IntType(64)
            ptrs = []
            for a, i in ((0, 1), (2, 3)):
                arr = context.make_array(sig.args[a])(context, builder, args[a])
                p = builder.gep(arr.data, [context.cast(builder, args[i], sig.args[i], types.int64)])
                ptrs.append(builder.ptrtoint(p, i64))
            fn = ir.FunctionType(ir.VoidType(), [i64, i64])
            builder.call(ir.InlineAsm(fn, ptx, "l,l,~{memory}", side_effect=True), ptrs)
            return context.get_dummy_value()

        return types.void(dst, di, src, si), codegen

    return cp


cp_async4 = _cp_async(4)
cp_async16 = _cp_async(16)
cp_async_commit = _asm_void("cp.async.commit_group;")
# wait until at most n of this thread's committed groups are pending (n = stages - 1 of a ring)
cp_async_wait = {n: _asm_void(f"cp.async.wait_group {n};") for n in range(8)}


# ---- Hopper bulk copies: `cp.async.bulk` (the TMA engine's 1-D form) moves a contiguous run of
# bytes global -> shared without registers or per-lane instructions and signals an mbarrier when the
# bytes have landed (the decode kernel's `bulk` ring). One lane issues; every lane waits.
def _bar_asm(ptx):
    """An intrinsic f(arr, idx, x) emitting `ptx` with $0 the shared address of arr[idx] and $1 the
    uint32 x (volatile, memory clobber: LLVM keeps shared accesses on their side of it)."""
    @intrinsic
    def f(typingctx, arr, idx, x):
        def codegen(context, builder, sig, args):
            u32 = types.uint32
            addr = _smem_ptr(context, builder, sig.args[0], args[0], context.cast(builder, args[1], sig.args[1], u32))
            val = context.cast(builder, args[2], sig.args[2], u32)
            fn = ir.FunctionType(ir.VoidType(), [ir.IntType(32)] * 2)
            builder.call(ir.InlineAsm(fn, ptx, "r,r,~{memory}", side_effect=True), [addr, val])
            return context.get_dummy_value()

        return types.none(arr, idx, x), codegen

    return f


mbar_init = _bar_asm("mbarrier.init.shared::cta.b64 [$0], $1;")  # (bars, i, arrivals)
mbar_arrive_tx = _bar_asm("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;")  # (bars, i, bytes)
# (bars, i, parity): spin until the phase of that parity has completed (labels are local to { })
mbar_wait = _bar_asm("{ .reg .pred p;\nLAB_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1;\n"
                      " @!p bra LAB_WAIT;\n}")
mbar_fence_init = _asm_void("fence.mbarrier_init.release.cluster;")  # inits visible to the copy engine
# programmatic dependent launch (sm_90): a kernel launched with programmatic stream serialization
# (launch.launch_dependent) may start once every block of the kernel before it has run
# griddep_launch or exited; griddep_wait holds it until that kernel has finished and its writes are
# visible. Without such a launch both are no-ops.
griddep_launch = _asm_void("griddepcontrol.launch_dependents;")
griddep_wait = _asm_void("griddepcontrol.wait;")


@intrinsic
def bulk_g2s(typingctx, sarr, sidx, garr, gidx, nbytes, bars, bidx):
    """cp.async.bulk of nbytes (a multiple of 16; both addresses 16-byte aligned) from garr[gidx..]
    to sarr[sidx..] (element indices), completing as tx bytes on the mbarrier bars[bidx]."""
    def codegen(context, builder, sig, args):
        u32 = types.uint32
        dst = _smem_ptr(context, builder, sig.args[0], args[0], context.cast(builder, args[1], sig.args[1], u32))
        g = context.make_array(sig.args[2])(context, builder, args[2])
        i64 = ir.IntType(64)
        src = builder.ptrtoint(builder.gep(g.data, [context.cast(builder, args[3], sig.args[3], types.int64)]), i64)
        n = context.cast(builder, args[4], sig.args[4], u32)
        bar = _smem_ptr(context, builder, sig.args[5], args[5], context.cast(builder, args[6], sig.args[6], u32))
        i32 = ir.IntType(32)
        builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32, i32]),
                                  "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
                                  "r,l,r,r,~{memory}", side_effect=True), [dst, src, n, bar])
        return context.get_dummy_value()

    return types.none(sarr, sidx, garr, gidx, nbytes, bars, bidx), codegen


def _lds(n):
    """ld.shared.v{n}.u32 of arr[idx .. idx + n) (idx a multiple of n); volatile, so LLVM keeps it
    after the barrier wait that guards the bytes."""
    outs = ", ".join("$%d" % i for i in range(n))
    ptx = f"ld.shared.v{n}.u32 {{{outs}}}, [${n}];"

    @intrinsic
    def lds(typingctx, arr, idx):
        ret = types.UniTuple(_u32, n)

        def codegen(context, builder, sig, args):
            addr = _smem_ptr(context, builder, sig.args[0], args[0],
                             context.cast(builder, args[1], sig.args[1], types.uint32))
            rt = ir.LiteralStructType([ir.IntType(32)] * n)
            r = builder.call(ir.InlineAsm(ir.FunctionType(rt, [ir.IntType(32)]), ptx,
                                          ",".join(["=r"] * n) + ",r,~{memory}", side_effect=True), [addr])
            return context.make_tuple(builder, ret, [builder.extract_value(r, k) for k in range(n)])

        return ret(arr, idx), codegen

    return lds


lds2 = _lds(2)
lds4 = _lds(4)


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


def _sim_pack_f16(lo, hi):
    return np.uint32(_sim_to_f16(lo) | (_sim_to_f16(hi) << 16))


def _sim_pack_bf16(lo, hi):
    return np.uint32(_sim_to_bf16(lo) | (_sim_to_bf16(hi) << 16))


def _sim_dec8(table):
    lo, hi = table
    tab = [((lo if m < 4 else hi) >> (8 * (m & 3))) & 0xFF for m in range(8)]

    def dec8(x):
        x = int(x)
        half = [(tab[(x >> (4 * n)) & 7] << 8) | (((x >> (4 * n + 3)) & 1) << 15) for n in range(8)]
        return tuple(np.uint32(half[i] | (half[i + 4] << 16)) for i in range(4))
    return dec8


def _sim_dec_i8(x, sel):
    return _sim_f16x2(lambda u, v: u - v, _sim_prmt(x, 0x64646464, sel), 0x64806480)


def _sim_e4m3x2(a, b, sel):
    t = int(_sim_prmt(a, b, sel))
    return np.uint32(_sim_to_f16(_E4M3_TAB[t & 0xFF]) | (_sim_to_f16(_E4M3_TAB[(t >> 8) & 0xFF]) << 16))


def _sim_movm_t(x):
    words, lane = _sim_allgather(int(x))
    g, t = lane >> 2, lane & 3
    half = [(words[4 * r + g // 2] >> (16 * (g % 2))) & 0xFFFF for r in (2 * t, 2 * t + 1)]  # M[r][g]
    return np.uint32(half[0] | (half[1] << 16))


def _sim_mul_f16x2(a, b):
    return _sim_f16x2(lambda u, v: u * v, a, b)


_sim_lock = None


def _sim_allgather(value, size: int = 32):
    """Every thread of the calling simulator thread's group of `size` consecutive threads (a warp,
    or a warpgroup of 128) publishes `value`; returns all of them and the caller's index in the
    group (the simulator runs each CUDA thread as a Python thread; a barrier per (block, group))."""
    import threading

    global _sim_lock
    if _sim_lock is None:
        _sim_lock = threading.Lock()
    t = threading.current_thread()
    manager = t._manager
    bx, by, bz = manager._block_dim
    group = t.thread_id // size
    key = (tuple(t.blockIdx), size, group)
    with _sim_lock:
        table = manager.__dict__.setdefault("_coldkv_mma_warps", {})
        st = table.get(key)
        if st is None:
            st = table[key] = (threading.Barrier(min(size, bx * by * bz - size * group), timeout=120.0), [None] * size)
    barrier, vals = st
    vals[t.thread_id % size] = value
    barrier.wait()
    out = list(vals)
    barrier.wait()
    return out, t.thread_id % size


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


def _sim_mma_s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32: lane (gid, tig) holds A bytes (row gid | gid + 8
    in a0 | a1 and a2 | a3, k 4 tig + byte, + 16 in a2, a3), B bytes (k 4 tig + byte | + 16, col gid),
    C as m16n8k16's; exact integer sums."""
    frags, lane = _sim_allgather((a0, a1, a2, a3, b0, b1))
    A = np.zeros((16, 32), np.int64)
    B = np.zeros((32, 8), np.int64)

    def s8(w, i):
        b = (int(w) >> (8 * i)) & 0xFF
        return b - 256 if b & 0x80 else b
    for ln, (x0, x1, x2, x3, y0, y1) in enumerate(frags):
        g, t = ln >> 2, ln & 3
        for (r, k), w in (((g, 4 * t), x0), ((g + 8, 4 * t), x1), ((g, 4 * t + 16), x2), ((g + 8, 4 * t + 16), x3)):
            for i in range(4):
                A[r, k + i] = s8(w, i)
        for k, w in ((4 * t, y0), (4 * t + 16, y1)):
            for i in range(4):
                B[k + i, g] = s8(w, i)
    g, t = lane >> 2, lane & 3
    D = A @ B
    return (np.int32(D[g, 2 * t] + c0), np.int32(D[g, 2 * t + 1] + c1), np.int32(D[g + 8, 2 * t] + c2),
            np.int32(D[g + 8, 2 * t + 1] + c3))


def _sim_ldg(n):
    def ldg(arr, idx):
        i = int(idx)
        return tuple(np.uint32(arr[i + k]) for k in range(n)) if n > 1 else np.uint32(arr[i])
    return ldg


def _sim_cp_async(n):
    def cp(dst, di, src, si):  # lands at once under the simulator
        for k in range(n):
            dst[int(di) + k] = src[int(si) + k]
    return cp


def _sim_ex2(x):
    y = np.float32(math.exp2(float(x)))
    return y if y >= np.float32(2.0 ** -126) else np.float32(0.0)


def _sim_nop():
    return None


def _sim_ldsm(trans):
    def ldsm(arr, idx):
        addrs, lane = _sim_allgather(int(idx))
        out = []
        for j in range(4):
            if not trans:
                out.append(np.uint32(arr[addrs[8 * j + lane // 4] + lane % 4]))
            else:
                c = lane // 4  # column of the stored matrix = row of the transposed one
                h = []
                for r in (2 * (lane % 4), 2 * (lane % 4) + 1):
                    w = int(arr[addrs[8 * j + r] + c // 2])
                    h.append((w >> (16 * (c % 2))) & 0xFFFF)
                out.append(np.uint32(h[0] | (h[1] << 16)))
        return tuple(out)
    return ldsm


def _sim_sts4(arr, idx, a, b, c, d):
    i = int(idx)
    for k, v in enumerate((a, b, c, d)):
        arr[i + k] = np.uint32(v)


def _sim_cp_async16_zfill(sarr, sidx, garr, gidx, nbytes):
    i, g = int(sidx), int(gidx)
    for k in range(4):
        sarr[i + k] = np.uint32(garr[g + k]) if int(nbytes) == 16 else np.uint32(0)


def _sim_word(v):
    """The 32-bit pattern of a 4-byte scalar (a bulk copy moves bytes, not values)."""
    return np.asarray(v).reshape(1).view(np.uint32)[0] if np.asarray(v).dtype.itemsize == 4 else np.uint32(v)


# mbarrier under the simulator: bars[i] = completed phases + (pending tx bytes << 32); a bulk copy
# lands at once, and the phase completes when the expected bytes have all landed
def _sim_mbar_init(bars, i, count):
    bars[int(i)] = 0


def _sim_mbar_arrive_tx(bars, i, nbytes):
    bars[int(i)] = int(bars[int(i)]) + (int(nbytes) << 32)


def _sim_mbar_wait(bars, i, parity):
    import time

    while int(bars[int(i)]) & 1 == int(parity):
        time.sleep(0)


def _sim_bulk_g2s(sarr, sidx, garr, gidx, nbytes, bars, bidx):
    s, g = int(sidx), int(gidx)
    for k in range(int(nbytes) // 4):
        sarr[s + k] = _sim_word(garr[g + k]) if sarr.dtype == np.uint32 else garr[g + k]
    left = int(bars[int(bidx)]) - (int(nbytes) << 32)
    bars[int(bidx)] = left + 1 if left >> 32 == 0 else left


def _sim_install():
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    if not hasattr(FakeCUDAModule, "any_sync"):  # the decode / rows kernels' warp vote
        FakeCUDAModule.any_sync = lambda self, mask, pred: self.ballot_sync(mask, pred) != 0


from numba import config as _config  # noqa: E402

SIMULATED = bool(_config.ENABLE_CUDASIM)
if SIMULATED:
    mma_f16, mma_bf16 = _sim_mma(_sim_f16), _sim_mma(_sim_bf16)
    mma_s8 = _sim_mma_s8
    pack_f16, pack_bf16 = _sim_pack_f16, _sim_pack_bf16
    dec_i8 = _sim_dec_i8
    dec8_iso3 = _sim_dec8(_DEC8_ISO3)
    e4m3x2, mul_f16x2, ex2 = _sim_e4m3x2, _sim_mul_f16x2, _sim_ex2
    movm_t = _sim_movm_t
    ldg2, ldg4 = _sim_ldg(2), _sim_ldg(4)
    ldsm_x4, ldsm_x4_t, sts4, cp_async16_zfill = _sim_ldsm(False), _sim_ldsm(True), _sim_sts4, _sim_cp_async16_zfill
    cp_async_wait_all = lambda: None  # noqa: E731
    cp_async4, cp_async16 = _sim_cp_async(1), _sim_cp_async(4)
    cp_async_commit = _sim_nop
    cp_async_wait = {n: _sim_nop for n in range(8)}
    mbar_init, mbar_arrive_tx, mbar_wait, bulk_g2s = _sim_mbar_init, _sim_mbar_arrive_tx, _sim_mbar_wait, _sim_bulk_g2s
    mbar_fence_init, lds2, lds4 = _sim_nop, _sim_ldg(2), _sim_ldg(4)
    griddep_launch = griddep_wait = _sim_nop  # the simulator runs launches one after another
