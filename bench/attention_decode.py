"""Decode attention over the paged cache vs torch SDPA on bf16 KV, validate first (H200 + torch).

    python bench/attention_decode.py                       # full grid, writes bench/results/attention_decode.json
    python bench/attention_decode.py --contexts 4096 --out /tmp/x.json   # quick
    python bench/attention_decode.py --wait-pid PID        # compile first, time after PID exits

For each shape (q heads / kv heads / head_dim) and context, and each format (K/V), the pools are
filled on the device with random codes and scales (random shuffled block table), and:
  1. validate: coldkv's output vs a float64 torch attention over the same pages dequantized by
     torch code written here from the format definitions (an independent decoder);
  2. time coldkv (attention kernel + split reduction) and SDPA (`enable_gqa=True`) on bf16 K/V
     of the same shape: CUDA events around each call, an L2 flush (reading 1 GiB) before each, the
     median of --repeats after warm-up. Until session 40 the flush wrote the 1 GiB (zero_), which
     leaves L2 full of dirty lines whose write-back then lands in the timed call (~10 us for SDPA,
     5-10 for coldkv on the H100 at 587c757); a decode step finds L2 clean after the weight GEMMs.
     Every row still carries that timing too: `sdpa_bf16_us_dirty_l2`, `coldkv_us_dirty_l2`,
     `speedup_dirty_l2` (comparable with files before session 40). After the flush the GPU spins
     ~2 ms (event_time) so the host's launch (`enqueue_us`, 400-650 us from Python) is enqueued
     before the start event fires; until 35b3f2e only the flush's ~250 us covered it and the
     excess was timed. Each row
     is also timed as a CUDA-graph replay of the same call (device-position mode), which has no
     Python in it and is how the engine runs a decode step: that is `coldkv_us` (and `speedup`,
     `frac_copy_bw`), the number reported against SDPA. The eager call is `coldkv_eager_us`: the same kernels, but
     host time can land in its interval (at 84c9650 on the H200, 283 against 38 us for nvfp4 at
     32768; at ffa233c on the H100 within 1% of the replay). Files written before
     session 29 named the replay `coldkv_graph_us` (`speedup_graph`) and the eager call `coldkv_us`.
  3. copy bandwidth in the same run: torch d2d copy and a Numba copy kernel, 1 GiB.

Napkin math (bytes per token per kv head, K + V, d=128): bf16 512; int8 2*(128+4) = 264;
nvfp4/iso3 2*(64+8) = 144. At 131072 tokens x 8 kv heads: bf16 537 MB, int8 277 MB, nvfp4 151 MB;
at a copy bandwidth of ~4 TB/s: 134 / 69 / 38 us. `frac_copy_bw` = (KV bytes / coldkv time) /
torch copy bandwidth. Compute: G multiply-adds per K value and per V value, on tensor cores
(mma.sync) by default, fp32 CUDA cores in the `@fma` rows.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchutil import clocks_under_load, compile_cases, git_commit, versions  # noqa: E402

from coldkv.numba_kernels import attention_cuda as A  # noqa: E402
from coldkv.numba_kernels import attention_mma as M  # noqa: E402
from coldkv.numba_kernels import quant as Q  # noqa: E402

FORMATS = {"bf16": (Q.BF16, Q.BF16), "int8": (Q.INT8, Q.INT8), "nvfp4": (Q.NVFP4, Q.NVFP4),
           "iso3": (Q.ISO3, Q.ISO3), "nvfp4/iso3": (Q.NVFP4, Q.ISO3)}
# The default rows run kernel="auto" (the tensor-core kernel, attention_mma, uint64 indices, its
# `_MMA_TUNED` register cap of attention_cuda where one is set). FORMAT@KNOB runs a variant (any
# format, by --formats; DEFAULT_VARIANTS also run at --variant-contexts on the first shape): "fma" the
# fp32 CUDA-core kernel, "i64" the int64-index build, "r0" no register cap, "r128" capped at 128
# registers (4 blocks per SM), "t4" 32-token chunks, "p" / "p128" software-pipelined loads uncapped /
# at 128 (measured no better since dd17991), "pN" mma_pipe off at 128 registers (bf16's setting
# before dd17991), "k8off" int8 keys decoded to fp16 instead of s8 MMAs (attention_mma k8, the
# default), "ws128" a workspace of 128 splits (32 blocks per kv head, half the default's at 131072
# tokens: a shorter reduce, 2 blocks per SM instead of 4; ws64, ws256 alike), "qs96" q's MMA fragments in shared memory
# at 96 registers (attention_mma qsmem: int8 then runs 5 blocks per SM instead of 4; session 20),
# "qs80" the same at 80 (6 blocks, 11 spill loads/stores in int8's chunk loop by the SASS), "qs128"
# at 128 (4 blocks, as the default; session 21's SASS: int8's chunk issues its 8 K and V loads before
# its first IMMA, one memory latency a chunk, where the default waits for K, then V, and qs96 for
# K's two tiles one by one, then V), "qst4"
# with 32-token chunks, uncapped (int8: 130 registers, 3 blocks, twice the loads in flight a warp),
# ("qst4r128" the same at 128 registers: 4 blocks; ptxas 13.0 in session 41: 32 B spilled, the
# chunk loop 345 instructions a 16 tokens against the default's 386), "qsp" q in shared memory
# with software-pipelined loads (int8: 124 registers uncapped, no spill,
# so 4 blocks an SM with the next chunk's loads in flight; int8@p was 238 against 98 us at 6d7ef6e,
# not understood). "bulk" the build of the default's knobs reading its pages through a ring of two
# chunks a warp in shared memory, filled by cp.async.bulk (attention_mma bulk: the next chunk's bytes
# in flight without registers or issue slots; the 4-bit formats' default since session 26), "bulk96"
# the same at 96 registers, "bulkr0" uncapped, "nobulk" the default's knobs without the ring.
# "tm" the default's knobs with the K product's tokens on the MMA rows (attention_mma tm: one MMA per
# 16 tokens a k16 step instead of two, no zero rows of q, P transposed by movmatrix; 4-bit and bf16
# keys; session 27, offline), "tmnobulk" the same without the ring, "bulkt4" the ring with 32-token
# chunks at 128 registers (nvfp4: 20 spilled bytes), "tmbulkt4" with tm too (no spill; ptxas 13.0:
# nvfp4's chunk loop 587 instructions a 16 tokens against the default's 785, iso3 698 against 926),
# "tmbulkt4r96" at 96 registers (5 blocks an SM instead of 4; 204 B spilled, loop 612), "tmr168" tm at
# 168 registers (24/4/256: 3 blocks an SM instead of the default's 2 at 190 registers; no spill, loop
# 970 against 1040 for nvfp4, 1194 against 1264 for iso3), "tmqs96" tm through the ring with q in shared
# memory at 96 registers (5 blocks an SM; nvfp4: 8 B spilled, loop 763 a 16 tokens), "tmbr168" tmr168
# through the ring (the 4-bit formats' default at 24/4/256 since c22a5fb), "tmb128" tm through the ring
# at 128 registers (the 4-bit formats' default at 32/8/128, for shapes `_MMA_TUNED` lacks); "notm" the
# default's knobs without tm; "pdl" the default with the split merge as a programmatic dependent launch (session 28;
# timed at ffa233c on the H100: 1-2% slower at every context, e.g. nvfp4 87.0 against 85.5 us at 131072).
_VK = {"fma": {"kernel": "fma"}, "i64": {"kernel": "mma", "mma_u64": False}, "r0": {"kernel": "mma", "max_registers": 0},
       "r128": {"kernel": "mma", "max_registers": 128}, "t4": {"kernel": "mma", "mma_tiles": 4},
       "p": {"kernel": "mma", "mma_pipe": True, "max_registers": 0},
       "p128": {"kernel": "mma", "mma_pipe": True, "max_registers": 128},
       "pN": {"kernel": "mma", "mma_pipe": False, "max_registers": 128},
       "k8off": {"kernel": "mma", "mma_k8": False},
       "ws64": {"kernel": "mma", "ws_splits": 64}, "ws128": {"kernel": "mma", "ws_splits": 128},
       "ws256": {"kernel": "mma", "ws_splits": 256},
       "qs96": {"kernel": "mma", "mma_qsmem": True, "max_registers": 96},
       "qs80": {"kernel": "mma", "mma_qsmem": True, "max_registers": 80},
       "qs128": {"kernel": "mma", "mma_qsmem": True, "max_registers": 128},
       "qst4": {"kernel": "mma", "mma_qsmem": True, "mma_tiles": 4, "max_registers": 0},
       "qst4r128": {"kernel": "mma", "mma_qsmem": True, "mma_tiles": 4, "max_registers": 128},
       "qsp": {"kernel": "mma", "mma_qsmem": True, "mma_pipe": True, "max_registers": 128},
       "bulk": {"kernel": "mma", "mma_bulk": True}, "bulk96": {"kernel": "mma", "mma_bulk": True, "max_registers": 96},
       "bulkr0": {"kernel": "mma", "mma_bulk": True, "max_registers": 0},
       "nobulk": {"kernel": "mma", "mma_bulk": False},
       "pdl": {"kernel": "mma", "mma_pdl": True},
       "tm": {"kernel": "mma", "mma_tm": True}, "notm": {"kernel": "mma", "mma_tm": False}, "tmnobulk": {"kernel": "mma", "mma_tm": True, "mma_bulk": False},
       "bulkt4": {"kernel": "mma", "mma_bulk": True, "mma_tiles": 4, "max_registers": 128},
       "tmbulkt4": {"kernel": "mma", "mma_tm": True, "mma_bulk": True, "mma_tiles": 4, "max_registers": 128},
       "tmbulkt4r96": {"kernel": "mma", "mma_tm": True, "mma_bulk": True, "mma_tiles": 4, "max_registers": 96},
       "tmr168": {"kernel": "mma", "mma_tm": True, "max_registers": 168},
       "tmbr168": {"kernel": "mma", "mma_tm": True, "mma_bulk": True, "max_registers": 168},
       "tmb128": {"kernel": "mma", "mma_tm": True, "mma_bulk": True, "max_registers": 128},
       "tmqs96": {"kernel": "mma", "mma_tm": True, "mma_bulk": True, "mma_qsmem": True, "max_registers": 96}}
VARIANTS = {f"{f}@{v}": (f, kw) for f in FORMATS for v, kw in _VK.items()}  # any format@knob by name
# what a run adds at --variant-contexts: the 4-bit formats before tm became their default (@notm, c22a5fb)
# and before the bulk ring (@nobulk: now tm without it), int8 with the ring, and the 32-token-chunk tm
# build (faster than tm at 360000 tokens, slower at 32768 on the H100 at 29ea3c3 and ffa233c), and
# int8 with more bytes in flight (session 41: on the H200 int8 reads at 0.76 of the copy bandwidth,
# on the H100 at 0.95): 5 blocks an SM (qs96), 32-token chunks (qst4 at 3 blocks, qst4r128 at 4),
# the next chunk's loads under this one's MMAs (qsp)
DEFAULT_VARIANTS = ["nvfp4@notm", "iso3@notm", "nvfp4/iso3@notm", "nvfp4@nobulk", "int8@bulk", "nvfp4@tmbulkt4",
                    "iso3@tmbulkt4", "int8@qs96", "int8@qst4", "int8@qst4r128", "int8@qsp"]
SHAPES = [(32, 8, 128), (24, 4, 256)]
CONTEXTS = [32768, 131072, 360000]
P = 64


# ------------------------------------------------------------------------------ data on device
DEV = "cuda"  # "cpu" with --sim (the CUDA simulator; validation only)


def to_nb(t):
    """torch tensor -> numba device array (zero-copy on the GPU; a copy under the simulator)."""
    return cuda.as_cuda_array(t) if DEV == "cuda" else cuda.to_device(t.numpy())


def make_plane(torch, fmt, n_pages, D, gen):
    """Random codes + scales of one pool (torch tensors), with plausible value ranges."""
    dev = DEV
    if fmt == Q.BF16:
        codes = (torch.randn((n_pages, P, D), device=dev, generator=gen)).to(torch.bfloat16).view(torch.int16)
        scales = torch.zeros((n_pages, P, 0), dtype=torch.uint8, device=dev)
    elif fmt == Q.INT8:
        codes = torch.randint(-127, 128, (n_pages, P, D), dtype=torch.int8, device=dev, generator=gen)
        scales = torch.rand((n_pages, P, 1), device=dev, generator=gen) * 0.02 + 0.005
    else:
        codes = torch.randint(0, 256, (n_pages, P, D // 2), dtype=torch.uint8, device=dev, generator=gen)
        # E4M3 bytes 0x28..0x47: 0.25 .. 1.9 (0x38 = 1.0)
        scales = torch.randint(0x28, 0x48, (n_pages, P, D // 16), dtype=torch.uint8, device=dev, generator=gen)
    return codes, scales


def torch_dequant(torch, fmt, codes, scales, g, D):
    """Pool -> float32 [n_pages, P, D], from the format definitions (independent of the kernels)."""
    if fmt == Q.BF16:
        return (codes.to(torch.int32) << 16).view(torch.float32)
    if fmt == Q.INT8:
        return codes.float() * scales
    e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], device=DEV)
    iso3 = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, -0., -1, -2, -3, -4, -5, -6, -7], device=DEV)
    tab = iso3 if fmt == Q.ISO3 else e2m1
    c = codes.to(torch.int64)
    nib = torch.stack([c & 15, c >> 4], dim=-1).reshape(codes.shape[0], P, D)  # element 2i low nibble
    e4 = torch.from_numpy(Q.ref_e4m3_decode(np.arange(256, dtype=np.uint8))).to(DEV)
    step = e4[scales.to(torch.int64)] / g  # [n, P, D/16]
    return (tab[nib].reshape(codes.shape[0], P, D // 16, 16) * step[..., None]).reshape(codes.shape[0], P, D)


class Case:
    def __init__(self, torch, fmt_name, L, Hq, H, D, seed=0):
        self.torch, self.name, self.L, self.Hq, self.H, self.D = torch, fmt_name, L, Hq, H, D
        base, kw = VARIANTS.get(fmt_name, (fmt_name, {}))
        self.kw = {k: v for k, v in kw.items() if k != "ws_splits"}
        G = Hq // H
        self.mma = A._use_mma(self.kw.get("kernel", "auto"), *FORMATS[base], G, D)
        self.kf, self.vf = FORMATS[base]
        gen = torch.Generator(device=DEV).manual_seed(seed)
        npl = -(-L // P)
        self.npl = npl
        n_pages = H * npl + 1
        table = torch.full((2, H, npl + 1), -1, dtype=torch.int32, device=DEV)
        for plane in range(2):
            table[plane, :, :npl] = torch.randperm(n_pages, device=DEV, generator=gen)[: H * npl].reshape(H, npl).int()
        self.table_t = table
        self.pools_t = [make_plane(torch, self.kf, n_pages, D, gen), make_plane(torch, self.vf, n_pages, D, gen)]
        self.gscale_t = torch.ones((2, H), device=DEV)
        self.q_t = torch.randn((1, Hq, D), device=DEV, generator=gen)
        self.out_t = torch.full((1, Hq, D), float("nan"), device=DEV)
        ca = to_nb
        self.args = [ca(self.q_t), ca(self.out_t), L - 1, 1.0 / math.sqrt(D),
                     self.kf, ca(self.pools_t[0][0]), ca(self.pools_t[0][1]),
                     self.vf, ca(self.pools_t[1][0]), ca(self.pools_t[1][1]),
                     ca(self.gscale_t), ca(table)]
        self.ws = A.AttentionWorkspace(kw.get("ws_splits", 4096), 1, Hq, D)

    def graph(self):
        """The same call captured once in a CUDA graph in device-position mode (pos0 an int32[1]
        device array, plan_len = L): (stream, replay function, destroy function). Replays time the
        GPU work without the Python launch cost (a decode step is replayed as one graph)."""
        self.pos_dev = cuda.to_device(np.array([self.L - 1], np.int32))
        args = list(self.args)
        args[2] = self.pos_dev
        return capture_graph(self.torch, lambda nb: A.paged_attention_cuda(*args, self.ws, stream=nb,
                                                                            plan_len=self.L, **self.kw))

    def kv_bytes(self):
        per_tok = sum((c.element_size() * c[0, 0].numel() + s.element_size() * s[0, 0].numel())
                      for c, s in self.pools_t)
        return per_tok * self.L * self.H

    def run(self):
        A.paged_attention_cuda(*self.args, self.ws, **self.kw)

    def result(self):
        if DEV == "cuda":
            return self.out_t
        return self.torch.from_numpy(self.args[1].copy_to_host())

    def reference(self):
        torch = self.torch
        dense = []
        for plane, fmt in enumerate((self.kf, self.vf)):
            codes, scales = self.pools_t[plane]
            x = torch.empty((self.H, self.L, self.D), device=DEV, dtype=torch.float64)
            for h in range(self.H):
                pages = self.table_t[plane, h, : self.npl].long()
                deq = torch_dequant(torch, fmt, codes[pages], scales[pages], 1.0, self.D)
                x[h] = deq.reshape(-1, self.D)[: self.L].double()
            dense.append(x)
        k, v = dense
        G = self.Hq // self.H
        q = self.q_t[0]
        eps = 0.0
        if self.mma and self.kw.get("mma_k8", True) and M.supports_k8(self.kf, G, self.D):
            # int8 keys on s8 MMAs: q * sm_scale * log2(e) as a 16-bit integer per head (its spec)
            qs = np.float32(1.0 / math.sqrt(self.D) * A._LOG2E)
            x = (q.float() * float(qs)).reshape(self.Hq, self.D).cpu().numpy()
            q = torch.from_numpy(M.ref_q_int16(x)).to(q.device).double().div(float(qs)).reshape(q.shape)
            eps = 2.0 ** -8 if self.vf == Q.BF16 else 2.0 ** -11
        elif self.mma:  # the tensor-core kernel rounds q * sm_scale * log2(e) and p to 16 bits
            qs = float(np.float32(1.0 / math.sqrt(self.D) * A._LOG2E))
            q = (q * qs).to(torch.bfloat16 if self.kf == Q.BF16 else torch.float16).double() / qs
            eps = 2.0 ** -8 if self.vf == Q.BF16 else 2.0 ** -11
        q = q.double().reshape(self.H, G, self.D)
        s = torch.einsum("hgd,hld->hgl", q, k) / math.sqrt(self.D)
        p = torch.softmax(s, dim=-1)
        out = torch.einsum("hgl,hld->hgd", p, v).reshape(1, self.Hq, self.D)
        # bound on the 16-bit rounding of p: eps * (P |V|), 2x margin
        extra = 2 * eps * torch.einsum("hgl,hld->hgd", p, v.abs()).reshape(1, self.Hq, self.D)
        return out, extra

    def free(self):
        del self.pools_t, self.args, self.ws


def capture_graph(torch, launch):
    """launch(numba stream) captured once in a CUDA graph on a new torch stream, after one eager
    call outside the capture (which compiles): (stream, replay function, destroy function)."""
    from cuda.bindings import driver as cu

    def ok(res):
        if res[0] != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA driver error {res[0]}")
        return res[1] if len(res) > 1 else None

    s = torch.cuda.Stream()
    nb = cuda.external_stream(s.cuda_stream)
    launch(nb)
    s.synchronize()
    h = cu.CUstream(s.cuda_stream)
    ok(cu.cuStreamBeginCapture(h, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
    try:
        launch(nb)
    finally:  # never leave the stream capturing
        g = ok(cu.cuStreamEndCapture(h))
    gx = ok(cu.cuGraphInstantiate(g, 0))

    def destroy():
        cu.cuGraphExecDestroy(gx)
        cu.cuGraphDestroy(g)

    return s, lambda: ok(cu.cuGraphLaunch(gx, h)), destroy


def sdpa_step(torch, Hq, H, L, D):
    """The peer: one decode step of torch SDPA (enable_gqa) over random bf16 K/V of L tokens, as a
    callable (its tensors live as long as it does)."""
    qb = torch.randn((1, Hq, 1, D), device="cuda", dtype=torch.bfloat16)
    kb = torch.randn((1, H, L, D), device="cuda", dtype=torch.bfloat16)
    vb = torch.randn((1, H, L, D), device="cuda", dtype=torch.bfloat16)
    return lambda: torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, enable_gqa=True)


def event_time(torch, fn, flush, repeats, spin_cycles=4_000_000, clean=False):
    """Median microseconds of fn() between CUDA events, each after an L2 flush; + CPU enqueue us.
    After the flush the GPU spins for spin_cycles (~2 ms at 1980 MHz, torch.cuda._sleep) so that
    it is still busy when the host has enqueued fn: the flush alone lasts ~250 us, and a prefill
    launch from Python takes up to ~650 us (H100 at 35b3f2e), whose excess was timed as kernel time.
    The flush writes the 1 GiB `flush` (zero_), or with clean reads it (sum): a written flush leaves
    L2 full of dirty lines (50 MB on the H100), whose write-back to DRAM then lands inside fn's
    interval; a read one leaves it clean, as a decode step finds it after the weight GEMMs."""
    fn()
    fn()
    torch.cuda.synchronize()
    times, cpu = [], []
    for _ in range(repeats):
        if clean:
            flush.sum()
        else:
            flush.zero_()
        torch.cuda._sleep(spin_cycles)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        c0 = time.perf_counter()
        fn()
        cpu.append((time.perf_counter() - c0) * 1e6)
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1000.0)
    return float(np.median(times)), float(np.median(cpu))


@cuda.jit
def _copy_kernel(src, dst):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < src.size:
        dst[i] = src[i]
        i += stride


def copy_bandwidth(torch, repeats):
    n = 1 << 30
    src = torch.ones(n // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    t_torch, _ = event_time(torch, lambda: dst.copy_(src), dst, repeats)  # flush = dst itself
    s2 = src.view(torch.int64)
    d2 = dst.view(torch.int64)
    sa, da = cuda.as_cuda_array(s2), cuda.as_cuda_array(d2)
    nsm = cuda.get_current_device().MULTIPROCESSOR_COUNT
    t_numba, _ = event_time(torch, lambda: _copy_kernel[nsm * 16, 256](sa, da), dst, repeats)
    return {"bytes": 2 * n, "torch_copy_TBps": 2 * n / t_torch / 1e6, "numba_copy_TBps": 2 * n / t_numba / 1e6,
            "torch_copy_us": t_torch, "numba_copy_us": t_numba}


def parse_shapes(args):
    if not args.shapes:
        return SHAPES
    return [tuple(int(x) for x in s.split("/")) for s in args.shapes]


def validate_only(torch, args):
    """Simulator smoke run of the validation path (small shapes)."""
    sys.path.insert(0, str(ROOT / "tests"))
    __import__("cudasim_warp").install()  # warp intrinsics for the simulator
    bad = 0
    for Hq, H, D in parse_shapes(args):
        for L in args.contexts:
            for name in args.formats:
                c = Case(torch, name, L, Hq, H, D, seed=L + D)
                c.run()
                got, (ref, extra) = c.result().double(), c.reference()
                err = float((got - ref).abs().max())
                tol = 1e-4 * max(float(ref.abs().max()), 1.0) + extra
                ok = bool(torch.isfinite(got).all()) and bool(((got - ref).abs() <= tol).all())
                bad += not ok
                print(f"{name} {Hq}/{H}/{D} L={L}: max err {err:.3g} {'ok' if ok else 'BAD'}", flush=True)
    return 1 if bad else 0


def compile_case(name: str, Hq: int, H: int, D: int) -> None:
    """Compile the kernels of one (format or variant, shape): a 200-token case run once, and its
    device-position kernel (the graph rows')."""
    import torch

    c = Case(torch, name, 200, Hq, H, D)
    c.run()
    c.graph()[2]()
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="*", default=CONTEXTS)
    ap.add_argument("--formats", nargs="*", default=list(FORMATS), help=f"of {list(FORMATS)}, or FORMAT@KNOB with a knob of {list(_VK)}")
    ap.add_argument("--variant-contexts", type=int, nargs="*", default=[131072],
                    help="contexts at which the VARIANTS also run (first shape only)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "attention_decode.json"))
    ap.add_argument("--clocks", action="store_true", help="sample the SM clock and power (nvidia-smi) while "
                    "each case and SDPA run back to back (~0.6 s a case)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--wait-pid", type=int, default=0, help="compile, then wait for this process before timing")
    ap.add_argument("--shapes", nargs="*", default=None, help="Hq/H/D, e.g. 8/2/64")
    ap.add_argument("--jobs", type=int, default=1, help="compile the kernels in this many processes first "
                    "(benchutil.compile_in_workers)")
    ap.add_argument("--sim", action="store_true", help="validate only, under NUMBA_ENABLE_CUDASIM=1 (CPU torch)")
    args = ap.parse_args()
    import torch

    global DEV
    if args.sim:
        DEV = "cpu"
        return validate_only(torch, args)

    dev = torch.cuda.get_device_name()
    doc = {"device": dev, "commit": git_commit(args.commit), "command": " ".join([sys.executable] + sys.argv),
           "versions": versions(), "page_tokens": P, "repeats": args.repeats, "results": [], "errors": []}

    def save():
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))

    # compile every kernel first (can overlap with the gpu tests), then time on a quiet GPU
    t0 = time.perf_counter()
    shapes = parse_shapes(args)
    jobs = [(name, Hq, H, D) for Hq, H, D in shapes
            for name in args.formats + (DEFAULT_VARIANTS if (Hq, H, D) == shapes[0] and args.variant_contexts else [])]
    doc["errors"] += compile_cases(compile_case, jobs, args.jobs)
    doc["compile_s"] = time.perf_counter() - t0
    print(f"compiled in {doc['compile_s']:.1f}s", flush=True)
    if args.wait_pid:
        while os.path.exists(f"/proc/{args.wait_pid}"):
            time.sleep(0.5)
    flush = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    try:
        doc["copy"] = copy_bandwidth(torch, args.repeats)
    except Exception as exc:
        doc["errors"].append(f"copy: {exc!r}")
        doc["copy"] = {"torch_copy_TBps": float("nan")}
    print(json.dumps(doc["copy"]), flush=True)
    save()
    for Hq, H, D in shapes:
        for L in args.contexts:
            try:
                sdpa = sdpa_step(torch, Hq, H, L, D)
                t_sdpa, _ = event_time(torch, sdpa, flush, args.repeats, clean=True)
                t_sdpa_dirty, _ = event_time(torch, sdpa, flush, args.repeats)
                clk_sdpa = (clocks_under_load(sdpa, 0.3, torch.cuda.synchronize)
                            if args.clocks else None)
                del sdpa
            except Exception as exc:
                doc["errors"].append(f"sdpa {Hq}/{H}/{D} L={L}: {exc!r}")
                t_sdpa, t_sdpa_dirty, clk_sdpa = float("nan"), float("nan"), None
            names = list(args.formats)
            if (Hq, H, D) == shapes[0] and L in args.variant_contexts:
                names += DEFAULT_VARIANTS
            for name in names:
                rec = {"format": name, "context": L, "q_heads": Hq, "kv_heads": H, "head_dim": D,
                       "sdpa_bf16_us": t_sdpa, "sdpa_bf16_us_dirty_l2": t_sdpa_dirty,
                       **({"sdpa_clocks": clk_sdpa} if args.clocks else {})}
                try:
                    c = Case(torch, name, L, Hq, H, D, seed=L + D)
                    c.run()
                    torch.cuda.synchronize()
                    ref, extra = c.reference()
                    got = c.result().double()
                    err = float((got - ref).abs().max())
                    scale = float(ref.abs().max())
                    rec["kernel"] = "mma" if c.mma else "fma"
                    rec["max_abs_err"], rec["ref_max"] = err, scale
                    rec["max_bound"] = 1e-4 * max(scale, 1.0) + float(extra.max())
                    tol = 1e-4 * max(scale, 1.0) + extra
                    rec["valid"] = bool(torch.isfinite(got).all()) and bool(((got - ref).abs() <= tol).all())
                    t, cpu = event_time(torch, c.run, flush, args.repeats, clean=True)
                    if args.clocks:  # the SM clock the kernel ran at (nvfp4 decode is ALU-bound, SDPA is not)
                        rec["clocks"] = clocks_under_load(c.run, 0.3, torch.cuda.synchronize)
                    try:  # CUDA-graph replay: the GPU time without Python launch cost
                        gs, replay, destroy = c.graph()
                        try:
                            with torch.cuda.stream(gs):
                                c.out_t.fill_(float("nan"))
                                replay()
                                gs.synchronize()
                                gout = c.result().double()
                                rec["graph_valid"] = bool(torch.isfinite(gout).all()) and bool(
                                    ((gout - ref).abs() <= tol).all())
                                tg, _ = event_time(torch, replay, flush, args.repeats, clean=True)
                                tgd, _ = event_time(torch, replay, flush, args.repeats)
                            rec.update({"coldkv_us": tg, "speedup": t_sdpa / tg, "coldkv_us_dirty_l2": tgd,
                                        "speedup_dirty_l2": t_sdpa_dirty / tgd})
                        finally:
                            destroy()
                    except Exception as exc:
                        rec["graph_error"] = repr(exc)
                    del ref, got, extra, tol
                    b = c.kv_bytes()
                    rec.update({"coldkv_eager_us": t, "enqueue_us": cpu, "kv_bytes": b,
                                "speedup_eager": t_sdpa / t})
                    if "coldkv_us" in rec:  # the graph replay: the engine's decode step
                        tg = rec["coldkv_us"]
                        rec["coldkv_TBps"] = b / tg / 1e6
                        rec["frac_copy_bw"] = b / tg / 1e6 / doc["copy"]["torch_copy_TBps"]
                    c.free()
                    del c
                except Exception as exc:
                    rec["error"] = repr(exc)
                    doc["errors"].append(f"{name} {Hq}/{H}/{D} L={L}: {traceback.format_exc(limit=3)}")
                doc["results"].append(rec)
                print(json.dumps(rec), flush=True)
                save()
                torch.cuda.empty_cache()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
