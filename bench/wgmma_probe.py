"""Does a Numba kernel run Hopper's warpgroup MMA? A probe for the prefill kernel's next step.

The fa prefill kernel uses mma.sync (m16n8k16, one warp); at 32k tokens it reaches ~230 TFLOP/s
and takes longer than HF's whole prefill (docs/kernels_log.md, "Prefill, session 11"). FA3 gets its
speed from wgmma.mma_async (a warpgroup of 4 warps, B and optionally A read from shared memory
through 64-bit descriptors, asynchronous), which needs the sm_90a target. numba-cuda 0.30
compiles for `sm_90a` on an H200 (numba/cuda/codegen.py `_ensure_cc`), so the instruction is
reachable through inline PTX. This probe checks one m64n64k16 bf16 wgmma (A in registers, B in
shared memory without swizzle, K-major as S = Q K^T would read K, and N-major with trans-b as
O = P V would read V) against numpy for both readings of the descriptor's two byte offsets, then
times a loop of accumulating wgmmas on every SM.

    python bench/wgmma_probe.py --commit C --out $OUT/wgmma_probe.json

Each case runs in its own process (`--case NAME`): a fault poisons the CUDA context, and at
dedf2c8 the first case's CUDA_ERROR_ILLEGAL_ADDRESS hid every other case. "harness" runs the
kernel without its wgmma, so a fault there is not the instruction's.

Without a GPU, `--ptx FILE` writes the kernels' PTX for sm_90a (for `ptxas -arch=sm_90a`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.extending import intrinsic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchutil import git_commit  # noqa: E402

from coldkv.numba_kernels.mma_ptx import _smem_ptr  # noqa: E402
from coldkv.numba_kernels.wgmma_ptx import fence_proxy_async  # noqa: E402

N_ACC = 32  # m64n64 f32 accumulator: 64 x 64 / 128 threads
_F32 = types.float32
_D = ", ".join(f"${i}" for i in range(N_ACC))


def _wgmma(accumulate: bool, trans_b: int = 0, repeat: int = 1):
    """(a0..a3 bf16x2 words, B descriptor[, 32 accumulators]) -> 32 accumulators of `repeat`
    back-to-back wgmma.mma_async.m64n64k16.f32.bf16.bf16 (B N-major when trans_b), fenced before,
    committed and waited for after."""
    a = ", ".join(f"${N_ACC + i}" for i in range(4))
    mma = [f"wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{_D}}}, {{{a}}}, ${N_ACC + 4}, "
           f"{1 if accumulate or i else 0}, 1, 1, {trans_b};\n" for i in range(repeat)]
    ptx = ("wgmma.fence.sync.aligned;\n" + "".join(mma) +
           "wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;")
    cons = ",".join(["=f"] * N_ACC + ["r"] * 4 + ["l"] + ([str(i) for i in range(N_ACC)] if accumulate else []))
    ret = types.UniTuple(_F32, N_ACC)

    def codegen(context, builder, sig, args):
        words = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[:4], sig.args[:4])]
        ins = words + [context.cast(builder, args[4], sig.args[4], types.uint64)]
        lt = [ir.IntType(32)] * 4 + [ir.IntType(64)]
        if accumulate:
            ins += [builder.extract_value(args[5], i) for i in range(N_ACC)]
            lt += [ir.FloatType()] * N_ACC
        rt = ir.LiteralStructType([ir.FloatType()] * N_ACC)
        r = builder.call(ir.InlineAsm(ir.FunctionType(rt, lt), ptx, cons + ",~{memory}", side_effect=True), ins)
        return context.make_tuple(builder, ret, [builder.extract_value(r, i) for i in range(N_ACC)])

    if accumulate:
        def wgmma_acc(typingctx, a0, a1, a2, a3, desc, acc):
            return ret(types.uint32, types.uint32, types.uint32, types.uint32, types.uint64, ret), codegen

        return intrinsic(wgmma_acc)

    def wgmma(typingctx, a0, a1, a2, a3, desc):
        return ret(types.uint32, types.uint32, types.uint32, types.uint32, types.uint64), codegen

    return intrinsic(wgmma)


wgmma_64x64 = _wgmma(False)
wgmma_64x64_nmajor = _wgmma(False, trans_b=1)
wgmma_64x64_acc4 = _wgmma(True, repeat=4)  # 4 MMAs per commit/wait: closer to the issue rate


def _codegen_ss(context, builder, sig, args):
    ins = [context.cast(builder, v, t, types.uint64) for v, t in zip(args, sig.args)]
    ptx = (f"wgmma.fence.sync.aligned;\nwgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{_D}}}, "
           f"${N_ACC}, ${N_ACC + 1}, 0, 1, 1, 0, 0;\nwgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;")
    rt = ir.LiteralStructType([ir.FloatType()] * N_ACC)
    r = builder.call(ir.InlineAsm(ir.FunctionType(rt, [ir.IntType(64)] * 2), ptx,
                                  ",".join(["=f"] * N_ACC + ["l", "l"]) + ",~{memory}", side_effect=True), ins)
    return context.make_tuple(builder, types.UniTuple(_F32, N_ACC), [builder.extract_value(r, i) for i in range(N_ACC)])


@intrinsic
def wgmma_64x64_ss(typingctx, desc_a, desc_b):
    """32 accumulators of one m64n64k16 bf16 wgmma with A too read from shared memory (the "SS"
    form, A K-major: trans-a 0) through its own descriptor."""
    return types.UniTuple(_F32, N_ACC)(types.uint64, types.uint64), _codegen_ss


@intrinsic
def smem_addr(typingctx, arr):
    """The 32-bit shared-window address of arr[0]."""
    def codegen(context, builder, sig, args):
        return _smem_ptr(context, builder, sig.args[0], args[0], ir.Constant(ir.IntType(32), 0))

    return types.uint32(arr), codegen


@cuda.jit(device=True)
def _desc(sm, lbo, sbo):
    """No-swizzle matrix descriptor: start address, leading and stride byte offsets (all >> 4)."""
    return ((np.uint64(smem_addr(sm)) >> np.uint64(4)) & np.uint64(0x3FFF)) \
        | (np.uint64(lbo >> 4) << np.uint64(16)) | (np.uint64(sbo >> 4) << np.uint64(32))


@cuda.jit(device=True)
def _a_frag(a, warp, lane):
    """The mma.m16n8k16 A fragment of rows 16 warp .. +15 of a [64, 16] bf16 bits (uint16)."""
    g, q = lane >> 2, lane & 3
    r0, r1, k = 16 * warp + g, 16 * warp + g + 8, 2 * q
    return _pair(a, r0, k), _pair(a, r1, k), _pair(a, r0, k + 8), _pair(a, r1, k + 8)


@cuda.jit(device=True)
def _pair(a, r, k):
    return np.uint32(a[r, k]) | (np.uint32(a[r, k + 1]) << np.uint32(16))


@cuda.jit(device=True)
def _stage_b(sm, b_core, t):
    """B's core matrices into shared memory, visible to the async proxy that wgmma reads with."""
    for i in range(t, 1024, 128):
        sm[i] = b_core[i]
    fence_proxy_async()
    cuda.syncthreads()


@cuda.jit
def probe_kernel(a, b_core, lbo, sbo, n_major, harness, out):
    """out [64, 64] f32 = a [64, 16] @ B, B given as b_core: 8x8 core matrices, K-major (the
    16 bytes of a core row run along K) or, n_major, N-major (trans-b); harness: zeros instead of
    the wgmma (checks the rest of the kernel)."""
    sm = cuda.shared.array(1024, np.uint16, alignment=128)
    t = cuda.threadIdx.x
    _stage_b(sm, b_core, t)
    warp, lane = t // 32, t % 32
    a0, a1, a2, a3 = _a_frag(a, warp, lane)
    g, q = lane >> 2, lane & 3
    if harness:
        for j in range(8):
            for e in range(4):
                out[16 * warp + g + 8 * (e >> 1), 8 * j + 2 * q + (e & 1)] = np.float32(0.0)
        return
    if n_major:
        d = wgmma_64x64_nmajor(a0, a1, a2, a3, _desc(sm, lbo, sbo))
    else:
        d = wgmma_64x64(a0, a1, a2, a3, _desc(sm, lbo, sbo))
    for j in range(8):
        for e in range(4):
            out[16 * warp + g + 8 * (e >> 1), 8 * j + 2 * q + (e & 1)] = d[4 * j + e]


@cuda.jit
def probe_ss_kernel(a_core, b_core, lbo, sbo, out):
    """out [64, 64] f32 = A @ B with A [64, 16] given as a_core (8x8 core matrices, K-major, read by
    descriptor with byte offsets (lbo, sbo)) and B as b_core in the layout the register-A cases
    validated (K-major, K-adjacent cores 128 bytes apart, N-adjacent 256): the SS form that Q in
    shared memory would take in the prefill kernel (frees Q's 32 registers a thread)."""
    sa = cuda.shared.array(1024, np.uint16, alignment=128)
    sb = cuda.shared.array(1024, np.uint16, alignment=128)
    t = cuda.threadIdx.x
    for i in range(t, 1024, 128):
        sa[i] = a_core[i]
    _stage_b(sb, b_core, t)  # (its fence and barrier cover sa's stores too)
    d = wgmma_64x64_ss(_desc(sa, lbo, sbo), _desc(sb, 128, 256))
    warp, lane = t // 32, t % 32
    g, q = lane >> 2, lane & 3
    for j in range(8):
        for e in range(4):
            out[16 * warp + g + 8 * (e >> 1), 8 * j + 2 * q + (e & 1)] = d[4 * j + e]


def a_layouts(a: np.ndarray) -> dict:
    """A [64 (M), 16 (K)] bf16 bits as K-major 8x8 core matrices (a core row: 8 K of one M):
    name -> (flat array, (byte offset between K-adjacent cores, between M-adjacent))."""
    kmaj = a.reshape(8, 8, 2, 8)  # [m block][m][k block][k]
    return {"a_kmajor_m_outer": (kmaj.transpose(0, 2, 1, 3), (128, 256)),  # [mb][kb][8 m][8 k]
            "a_kmajor_k_outer": (kmaj.transpose(2, 0, 1, 3), (1024, 128))}  # [kb][mb][8 m][8 k]


@cuda.jit
def loop_kernel(a, b_core, lbo, sbo, iters, out):
    """4 iters accumulating wgmmas per warpgroup (the same operands, 4 per commit/wait):
    throughput, not a result."""
    sm = cuda.shared.array(1024, np.uint16, alignment=128)
    t = cuda.threadIdx.x
    _stage_b(sm, b_core, t)
    a0, a1, a2, a3 = _a_frag(a, t // 32, t % 32)
    desc = _desc(sm, lbo, sbo)
    d = wgmma_64x64(a0, a1, a2, a3, desc)
    for _ in range(iters):
        d = wgmma_64x64_acc4(a0, a1, a2, a3, desc, d)
    s = np.float32(0.0)
    for i in range(N_ACC):
        s += d[i]
    out[cuda.blockIdx.x * 128 + t] = s


def b_layouts(b: np.ndarray) -> dict:
    """B [16 (K), 64 (N)] bf16 bits as 8x8 core matrices (128 bytes each) in shared memory:
    name -> (flat array, N-major?, (byte offset between K-adjacent cores, between N-adjacent))."""
    kmaj = b.T.reshape(8, 8, 2, 8)  # [n block][n][k block][k]
    nmaj = b.reshape(2, 8, 8, 8)  # [k block][k][n block][n]
    return {
        "kmajor_n_outer": (kmaj.transpose(0, 2, 1, 3), False, (128, 256)),  # [nb][kb][8 n][8 k]
        "nmajor_k_outer": (nmaj.transpose(0, 2, 1, 3), True, (1024, 128)),  # [kb][nb][8 k][8 n]
        "nmajor_n_outer": (nmaj.transpose(2, 0, 1, 3), True, (128, 256)),  # [nb][kb][8 k][8 n]
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=4096)
    ap.add_argument("--commit")
    ap.add_argument("--ptx", type=Path, help="write the PTX for sm_90a to this file and stop (no GPU needed)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "wgmma_probe.json")
    ap.add_argument("--case", help="run one check in this process (the driver runs each in its own)")
    a = ap.parse_args()
    if a.ptx:
        import numba.cuda.dispatcher as dispatcher

        class _Sm90:
            compute_capability = (9, 0)

        dispatcher.get_current_device = lambda: _Sm90()  # device functions ask for it
        sig = "void(uint16[:,::1], uint16[::1], int64, int64, boolean, boolean, float32[:,::1])"
        ptx = [cuda.compile_ptx(probe_kernel.py_func, sig, cc=(9, 0))[0],
               cuda.compile_ptx(probe_ss_kernel.py_func, "void(uint16[::1], uint16[::1], int64, int64, float32[:,::1])",
                                cc=(9, 0))[0],
               cuda.compile_ptx(loop_kernel.py_func,
                                "void(uint16[:,::1], uint16[::1], int64, int64, int64, float32[::1])", cc=(9, 0))[0]]
        a.ptx.write_text("\n".join(p.replace(".target sm_90", ".target sm_90a") for p in ptx))
        print(f"wrote {a.ptx}")
        return
    if a.case:
        run_case(a.case, a.iters)
        return
    # One process per case: an illegal address poisons the CUDA context, and at dedf2c8 the first
    # case's did, so no other case could run after it.
    import subprocess

    cases = ["harness"] + [f"{name}/{order}" for name in b_layouts(np.zeros((16, 64), np.uint16))
                           for order in ("kn", "nk")]
    cases += [f"ss:{name}/{order}" for name in a_layouts(np.zeros((64, 16), np.uint16)) for order in ("kn", "nk")]
    checks = {}
    for case in cases:
        try:
            r = subprocess.run([sys.executable, __file__, "--case", case], capture_output=True, text=True, timeout=90)
            line = [x for x in r.stdout.splitlines() if x.startswith("{")]
            checks[case] = json.loads(line[-1]) if line else {"ok": False, "error": (r.stderr.strip().splitlines()
                                                                                    or ["no output"])[-1][-300:]}
        except subprocess.TimeoutExpired:
            checks[case] = {"ok": False, "error": "timeout 90 s"}
        print(case, checks[case], flush=True)
    res = {"command": "python " + " ".join(sys.argv), "commit": git_commit(a.commit), "checks": checks}
    good = [c for c in cases if c != "harness" and not c.startswith("ss:") and checks[c].get("ok") and not b_layouts(
        np.zeros((16, 64), np.uint16))[c.split("/")[0]][1]]
    if good:
        r = subprocess.run([sys.executable, __file__, "--case", "loop:" + good[0], "--iters", str(a.iters)],
                           capture_output=True, text=True, timeout=120)
        line = [x for x in r.stdout.splitlines() if x.startswith("{")]
        res["loop"] = json.loads(line[-1]) if line else {"error": (r.stderr.strip().splitlines() or ["?"])[-1][-300:]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


def run_case(case: str, iters: int) -> None:
    """One check in this process, printed as a JSON line: "harness" (the kernel with its wgmma
    replaced by zeros: the launch and copies alone), "LAYOUT/kn" or "LAYOUT/nk" (B in that layout,
    its K-adjacent / N-adjacent core offsets in the descriptor's (LBO, SBO) fields or swapped), or
    "loop:LAYOUT/ORDER" (the throughput loop on a layout that passed)."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    A = rng.standard_normal((64, 16)).astype(ml_dtypes.bfloat16)
    B = rng.standard_normal((16, 64)).astype(ml_dtypes.bfloat16)
    want = A.astype(np.float64) @ B.astype(np.float64)
    a_dev = cuda.to_device(A.view(np.uint16))
    if case.startswith("ss:"):  # A from shared memory: its K-adjacent / M-adjacent offsets as (LBO, SBO) or swapped
        name, order = case[3:].split("/")
        core, (k_off, m_off) = a_layouts(A.view(np.uint16))[name]
        lbo, sbo = (k_off, m_off) if order == "kn" else (m_off, k_off)
        b_core = b_layouts(B.view(np.uint16))["kmajor_n_outer"][0]
        out = cuda.to_device(np.full((64, 64), np.nan, np.float32))
        probe_ss_kernel[1, 128](cuda.to_device(np.ascontiguousarray(core).reshape(-1)),
                                cuda.to_device(np.ascontiguousarray(b_core).reshape(-1)), lbo, sbo, out)
        got = out.copy_to_host()
        ok = bool(np.isfinite(got).all() and np.abs(got - want).max() <= 1e-4 * np.abs(want).max())
        err = float(np.nanmax(np.abs(got - want))) if np.isfinite(got).any() else float("nan")
        print(json.dumps({"case": case, "ok": ok, "max_abs_err": err, "lbo": lbo, "sbo": sbo}))
        return
    loop = case.startswith("loop:")
    name, order = (case[5:] if loop else case).split("/") if case != "harness" else ("kmajor_n_outer", "kn")
    core, n_major, (k_off, n_off) = b_layouts(B.view(np.uint16))[name]
    lbo, sbo = (k_off, n_off) if order == "kn" else (n_off, k_off)
    b_dev = cuda.to_device(np.ascontiguousarray(core).reshape(-1))
    if loop:
        dev = cuda.get_current_device()
        sms = dev.MULTIPROCESSOR_COUNT
        sink = cuda.device_array(4 * sms * 128, np.float32)
        loop_kernel[4 * sms, 128](a_dev, b_dev, lbo, sbo, 8, sink)  # compile
        cuda.synchronize()
        t0 = time.perf_counter()
        loop_kernel[4 * sms, 128](a_dev, b_dev, lbo, sbo, iters, sink)
        cuda.synchronize()
        dt = time.perf_counter() - t0
        flops = 2 * 64 * 64 * 16 * (4 * iters + 1) * 4 * sms
        # n64 tiles, one accumulator, 4 MMAs per commit/wait: a lower bound on the instruction's
        # rate (FA3 keeps several in flight with larger N)
        print(json.dumps({"case": case, "blocks": 4 * sms, "iters": iters, "ms": round(1e3 * dt, 3),
                          "tflops": round(flops / dt / 1e12, 1)}))
        return
    out = cuda.to_device(np.full((64, 64), np.nan, np.float32))
    harness = case == "harness"
    probe_kernel[1, 128](a_dev, b_dev, lbo, sbo, n_major, harness, out)
    got = out.copy_to_host()
    if harness:
        print(json.dumps({"case": case, "ok": bool((got == 0).all())}))
        return
    ok = bool(np.isfinite(got).all() and np.abs(got - want).max() <= 1e-4 * np.abs(want).max())
    err = float(np.nanmax(np.abs(got - want))) if np.isfinite(got).any() else float("nan")
    print(json.dumps({"case": case, "ok": ok, "max_abs_err": err, "lbo": lbo, "sbo": sbo}))


if __name__ == "__main__":
    main()
