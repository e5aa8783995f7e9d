"""Hopper warpgroup MMA (wgmma.mma_async, sm_90a) as Numba intrinsics, and their simulator emulation.

A warpgroup (4 consecutive warps, 128 threads) multiplies A [64, 16 nk] (registers: each warp's
16 rows in mma.m16n8k16's A fragment, 4 words per k16 step) by B [16 nk, n] read from shared
memory through a 64-bit matrix descriptor, into f32 accumulators laid out per warp as n / 8
m16n8 C fragments (`acc[j, e]`: row 16 warp + gid + 8 (e >> 1), column 8 j + 2 tig + (e & 1)).
One intrinsic issues the nk k16 steps back to back between `wgmma.fence` and commit + wait 0,
so to the code around it the MMA is synchronous (other warps and blocks overlap it).

B is stored without swizzle as 8x8 core matrices of 16-bit values, 128 contiguous bytes each
(8 rows of 16 bytes). K-major (trans_b 0): a core row runs along K. N-major (trans_b 1): along N.
The descriptor's leading byte offset (LBO) is the distance between K-adjacent cores and the
stride byte offset (SBO) between N-adjacent ones, for both majors: measured on the H200 by
bench/wgmma_probe.py (c513766: every (LBO = K step, SBO = N step) case correct, the swapped
readings wrong or faulting). Each k16 step advances the start address by `step` bytes.
(The SS form, A from shared memory too, served the prefill kernels that kept Q there; it went
with them in session 45, git has it at aa6ad1a; the probe's "ss:" cases measured its convention.)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import config, cuda, types
from numba.extending import intrinsic

from coldkv.numba_kernels.mma_ptx import _asm_void, _sim_allgather, _smem_ptr

SIMULATED = bool(config.ENABLE_CUDASIM)


def _desc_hi(lbo: int, sbo: int) -> int:
    """The descriptor's constant bits: LBO and SBO (>> 4, 14 bits each), no swizzle, base offset 0."""
    assert lbo % 16 == 0 and sbo % 16 == 0 and lbo < 1 << 18 and sbo < 1 << 18
    return ((lbo >> 4) << 16) | ((sbo >> 4) << 32)


def _wgmma(n: int, nk: int, bf16: bool, trans_b: bool, accumulate: bool, lbo: int, sbo: int, step: int,
           wait: bool = True):
    """Intrinsic f(acc, a, sarr, word) -> None: acc [n / 8, 4] f32 (+)= A @ B, A = a [nk, 4] uint32
    fragments, B at shared sarr[word] (32-bit words), k16 step s at + s * step bytes. wait=False:
    committed, not waited for: acc and a must not be touched until `wgmma_wait` (ptxas 13.0 keeps
    such a split unserialized: offline probe, session 15)."""
    dt = "bf16" if bf16 else "f16"
    na = n // 2  # accumulators per thread
    d = ", ".join(f"${i}" for i in range(na))
    A0 = na  # operand index of the first A word, then the descriptor
    DESC = na + 4 * nk
    lines = ["{ .reg .b64 dk;", "wgmma.fence.sync.aligned;"]
    for s in range(nk):
        a = ", ".join(f"${A0 + 4 * s + i}" for i in range(4))
        src = f"${DESC}"
        if s:
            lines.append(f"add.s64 dk, ${DESC}, {(s * step) >> 4};")
            src = "dk"
        scale_d = 1 if accumulate or s else 0
        lines.append(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dt}.{dt} {{{d}}}, {{{a}}}, {src}, "
                     f"{scale_d}, 1, 1, {int(trans_b)};")
    lines += ["wgmma.commit_group.sync.aligned;"] + (["wgmma.wait_group.sync.aligned 0;"] if wait else []) + ["}"]
    ptx = "\n".join(lines)
    # acc in and out when the MMA stays in flight, even for D = A B (scale-d 0 ignores it): ptxas
    # then keeps the accumulators in place from one issue to the next instead of serializing, C7515
    tied = accumulate or not wait
    cons = ",".join(["=f"] * na + ["r"] * (4 * nk) + ["l"] + ([str(i) for i in range(na)] if tied else []))
    hi = _desc_hi(lbo, sbo)
    assert step % 16 == 0

    def codegen(context, builder, sig, args):
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        acc = context.make_array(sig.args[0])(context, builder, args[0]).data
        aw = context.make_array(sig.args[1])(context, builder, args[1]).data
        addr = _smem_ptr(context, builder, sig.args[2], args[2], context.cast(builder, args[3], sig.args[3], types.uint32))
        lo = builder.and_(builder.lshr(addr, ir.Constant(i32, 4)), ir.Constant(i32, 0x3FFF))
        desc = builder.or_(builder.zext(lo, i64), ir.Constant(i64, hi))
        ins = [builder.load(builder.gep(aw, [ir.Constant(i64, i)])) for i in range(4 * nk)] + [desc]
        lt = [i32] * (4 * nk) + [i64]
        if tied:
            ins += [builder.load(builder.gep(acc, [ir.Constant(i64, i)])) for i in range(na)]
            lt += [f32] * na
        rt = ir.LiteralStructType([f32] * na)
        r = builder.call(ir.InlineAsm(ir.FunctionType(rt, lt), ptx, cons + ",~{memory}", side_effect=True), ins)
        for i in range(na):
            builder.store(builder.extract_value(r, i), builder.gep(acc, [ir.Constant(i64, i)]))
        return context.get_dummy_value()

    def wgmma(typingctx, acc, a, sarr, word):
        return types.void(acc, a, sarr, word), codegen

    if SIMULATED:
        return _sim_wgmma(n, nk, bf16, trans_b, accumulate, lbo, sbo, step)
    return intrinsic(wgmma)


_WGMMA: dict = {}


def wgmma(n: int, nk: int, bf16: bool, trans_b: bool, accumulate: bool, lbo: int, sbo: int, step: int,
          wait: bool = True):
    """The (cached) intrinsic of `_wgmma`: m64 n{n} k16 x nk, A from registers, B by descriptor."""
    key = (n, nk, bf16, trans_b, accumulate, lbo, sbo, step, wait)
    if key not in _WGMMA:
        _WGMMA[key] = _wgmma(*key)
    return _WGMMA[key]


def _tied_asm(text: str, nf: tuple, nu: int = 0):
    """Intrinsic f(*f32 arrays[, u32 array]) -> None: the inline asm `text` with every element of
    the f32 arrays (nf: their element counts) as an operand read and written, and the nu elements
    of the u32 array read. Side effects and a memory clobber order it with the wgmma asm, and the
    compiler neither moves nor reuses these registers across it."""
    nt = sum(nf)

    def codegen(context, builder, sig, args):
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        arrs = [context.make_array(t)(context, builder, v).data for t, v in zip(sig.args, args)]
        outs = [(j, i) for j, n in enumerate(nf) for i in range(n)]
        ins = [builder.load(builder.gep(arrs[j], [ir.Constant(i64, i)])) for j, i in outs]
        ins += [builder.load(builder.gep(arrs[len(nf)], [ir.Constant(i64, i)])) for i in range(nu)]
        cons = ",".join(["=f"] * nt + [str(i) for i in range(nt)] + ["r"] * nu)
        r = builder.call(ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([f32] * nt), [f32] * nt + [i32] * nu),
                                      text, cons + ",~{memory}", side_effect=True), ins)
        for k, (j, i) in enumerate(outs):
            builder.store(builder.extract_value(r, k), builder.gep(arrs[j], [ir.Constant(i64, i)]))
        return context.get_dummy_value()

    # (an intrinsic's typing function takes no *args: one per operand count)
    def asm1(typingctx, x):
        return types.void(x), codegen

    def asm2(typingctx, x, y):
        return types.void(x, y), codegen

    def asm3(typingctx, x, y, z):
        return types.void(x, y, z), codegen

    return intrinsic((asm1, asm2, asm3)[len(nf) + (1 if nu else 0) - 1])


def wgmma_wait(n: int, nk: int, ns: int = 0):
    """Intrinsic f(acc, a) -> None (ns > 0: f(acc, a, sacc)): wait for this warpgroup's committed
    wgmmas (wait_group 0), with acc [n / 8, 4] f32, a [nk, 4] uint32 (and sacc [ns / 8, 4] f32, a
    second accumulator in flight) as the asm's operands, so that the compiler neither moves nor
    reuses them while the MMAs that read a and write acc (and sacc) run."""
    if SIMULATED:
        return (lambda acc, a, sacc: None) if ns else (lambda acc, a: None)  # the emulated wgmma is done
    wait = _tied_asm("wgmma.wait_group.sync.aligned 0;", (n // 2, ns // 2) if ns else (n // 2,), 4 * nk)
    if ns:  # the operands in _tied_asm's order: f32 arrays first
        return cuda.jit(device=True, inline=True)(lambda acc, a, sacc: wait(acc, sacc, a))
    return wait


def wgmma_wait_acc(n: int, pending: int):
    """Intrinsic f(acc): wgmma.wait_group `pending` (all but the last `pending` committed groups
    done), with acc [n / 8, 4] f32, the accumulators of a group it retires, as operands."""
    if SIMULATED:
        return lambda acc: None
    return _tied_asm(f"wgmma.wait_group.sync.aligned {pending};", (n // 2,))


def reg_fence(n: int):
    """Intrinsic f(acc), acc [n / 8, 4] f32: an empty asm that reads and writes every element
    (CUTLASS's warpgroup_fence_operand): the instructions that define acc stay before it, so none
    is scheduled after an MMA issued next."""
    if SIMULATED:
        return lambda acc: None
    return _tied_asm("", (n // 2,))


@cuda.jit(device=True, inline=True)
def no_wgmma(acc, a, sarr, word):
    """What a build without wgmma calls in its place (never run)."""
    return


@intrinsic
def fence_proxy_async(typingctx):
    """Make this thread's shared-memory writes (st.shared, cp.async once waited for) visible to
    the async proxy that wgmma reads shared memory with; then a barrier for the other threads."""
    def codegen(context, builder, sig, args):
        builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "fence.proxy.async.shared::cta;",
                                  "~{memory}", side_effect=True), [])
        return context.get_dummy_value()

    return types.void(), codegen


def _bar(op):
    @intrinsic
    def bar(typingctx, bid, count):
        """bar.{op} id, count (named barrier id 1..15, count threads, a multiple of 32)."""
        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i32]), f"bar.{op} $0, $1;",
                                      "r,r,~{memory}", side_effect=True), vals)
            return context.get_dummy_value()

        return types.void(bid, count), codegen

    return bar


def setmaxnreg(n: int, inc: bool):
    """Intrinsic f(): this warpgroup's registers a thread become n (a multiple of 8, 24..256;
    sm_90a): a warp-specialized kernel's producer gives some up (inc False) and its consumers
    take them (inc True). Every warp of the warpgroup runs it; a no-op under the simulator."""
    if SIMULATED:
        return lambda: None
    assert n % 8 == 0 and 24 <= n <= 256
    return _asm_void(f"setmaxnreg.{'inc' if inc else 'dec'}.sync.aligned.u32 {n};")


bar_sync = _bar("sync")  # wait until `count` threads arrived at barrier id (this one included)
bar_arrive = _bar("arrive")  # count this thread in, without waiting


# ------------------------------------------------------------------------------ simulator
def _sim_halves_to_f32(h, bf16):
    h = np.asarray(h, np.uint32) & 0xFFFF
    return (h << 16).view(np.float32) if bf16 else h.astype(np.uint16).view(np.float16).astype(np.float32)


def _sim_wgmma(n, nk, bf16, trans_b, accumulate, lbo, sbo, step):
    """The wgmma of `_wgmma` from the PTX ISA's layouts: B's element (k, col) of step s is the
    16-bit value at byte word * 4 + s step + (k >> 3) LBO + (col >> 3) SBO + the in-core offset
    ((col & 7) 16 + (k & 7) 2 K-major, (k & 7) 16 + (col & 7) 2 N-major); A's fragments as
    mma.m16n8k16's, warp w of the group holding rows 16 w ..."""
    s_, k, col = np.meshgrid(np.arange(nk), np.arange(16), np.arange(n), indexing="ij")
    inner = (k & 7) * 16 + (col & 7) * 2 if trans_b else (col & 7) * 16 + (k & 7) * 2
    b_bytes = (s_ * step + (k >> 3) * lbo + (col >> 3) * sbo + inner).reshape(16 * nk, n)
    t, s_, i = np.meshgrid(np.arange(128), np.arange(nk), np.arange(4), indexing="ij")
    g, q = (t % 32) >> 2, t & 3
    a_rows = 16 * (t // 32) + g + 8 * (i & 1)  # words: (g, 2q) (g + 8, 2q) (g, 2q + 8) (g + 8, 2q + 8)
    a_cols = 16 * s_ + 2 * q + 8 * (i >> 1)

    def wgmma(acc, a, sarr, word):
        frags, me = _sim_allgather(np.array(a, np.uint32).copy(), 128)
        F = np.stack(frags)  # [128, nk, 4]
        A = np.zeros((64, 16 * nk), np.float32)
        A[a_rows, a_cols] = _sim_halves_to_f32(F, bf16)
        A[a_rows, a_cols + 1] = _sim_halves_to_f32(F >> 16, bf16)
        halves = np.asarray(sarr).view(np.uint16)
        B = _sim_halves_to_f32(halves[(4 * int(word) + b_bytes) // 2], bf16)
        w, g, q = me // 32, (me % 32) >> 2, me & 3
        D = A[16 * w: 16 * w + 16].astype(np.float64) @ B.astype(np.float64)
        for j in range(n // 8):
            for e in range(4):
                v = D[g + 8 * (e >> 1), 8 * j + 2 * q + (e & 1)]
                acc[j, e] = np.float32(v + (acc[j, e] if accumulate else 0.0))
        _sim_allgather(None, 128)  # no thread's shared stores may overtake another's reads

    return wgmma


if SIMULATED:
    def fence_proxy_async():  # noqa: F811 (the simulator has one memory proxy)
        return None

    import threading as _threading
    import time as _time

    _SIM_BARS_LOCK = _threading.Lock()
    # A bar.sync fails after this long without any arrival at any named barrier of its block: a
    # fixed wait per barrier failed under load (CI's two cores), where numba's lock per module on
    # every device-function call had 128 threads queue for minutes while still arriving one by one.
    _SIM_STALL_S = 120.0

    def _sim_bar(wait):
        def bar(bid, count):
            """A named barrier of the calling simulator thread's block: the count-th arrival starts
            the next phase; bar.sync waits for it (the warp-specialized kernel's producer and
            consumers hand tiles over with these). A thread that arrives twice in one phase is an
            error here: the kernels' protocols never do, so it means a missing wait elsewhere."""
            t = _threading.current_thread()
            block = tuple(t.blockIdx)
            with _SIM_BARS_LOCK:
                bars = t._manager.__dict__.setdefault("_coldkv_bars", {})
                st = bars.setdefault((block, int(bid)), [_threading.Condition(), set(), 0])  # [cv, arrived, phase]
                last = bars.setdefault((block, "last arrival"), [0.0])
                last[0] = _time.monotonic()
            cv, arrived = st[0], st[1]
            with cv:
                phase = st[2]
                if t.thread_id in arrived:
                    raise RuntimeError(f"simulated bar {int(bid)}: thread {t.thread_id} arrived twice in one phase")
                arrived.add(t.thread_id)
                if len(arrived) == int(count):
                    arrived.clear()
                    st[2] = phase + 1
                    cv.notify_all()
                elif wait:
                    while not cv.wait_for(lambda: st[2] != phase, timeout=5.0):
                        if _time.monotonic() - last[0] > _SIM_STALL_S:
                            raise RuntimeError(f"simulated bar.sync {int(bid)}: {len(arrived)} of {int(count)} "
                                               f"threads arrived, none at any barrier for {_SIM_STALL_S:.0f} s")
            return None

        return bar

    bar_sync = _sim_bar(True)  # noqa: F811
    bar_arrive = _sim_bar(False)  # noqa: F811
