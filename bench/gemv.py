"""Decode GEMVs (numba_kernels/gemv.py) against what the CUDA backend runs today for one token:
validate, then time (llm.c style).

    python bench/gemv.py --commit C                 # writes bench/results/gemv.json
    python bench/gemv.py --shapes bundled           # the bundled model's four products only

Per product of a decode step (QKV and gate|up: RMSNorm + GEMM to 16-bit; o_proj: GEMM accumulating
into the residual; down: SwiGLU + GEMM accumulating), at the bundled model's shapes and at an 8B's
(Qwen3-8B: hidden 4096, 32 q / 8 kv heads of 128, MLP 12288), four launches per round:
  fused    gemv.launch_gemv, one kernel
  unfused  the backend's pair (layers.launch_rms_norm / launch_swiglu, then cuBLAS; o_proj: cuBLAS alone)
  cublas   the cuBLAS GEMM alone (T = 1)
  copy     bench/codecs.py's copy_v4 of the weight bytes (bandwidth: a large model's GEMV is bound
           by its weights' reads; the bundled model's fit in L2, so there it is a latency floor)
each captured --repeats times into a CUDA graph and replayed (bench/layers.py's time_round: the
per-launch time includes the gap between graph nodes, as in a decode step). Ratios are what to
read: `fused_vs_unfused` > 1 means the fused kernel saves time. Bytes moved: N K 2 + the input.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from numba import cuda

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchutil import git_commit, versions  # noqa: E402
from layers import copy_v4_kernel, time_round  # noqa: E402

from coldkv.numba_kernels import gemv as G  # noqa: E402
from coldkv.numba_kernels import layers as L  # noqa: E402

SHAPES = {  # (product, K, N, prologue, epilogue)
    "bundled": [("qkv", 384, 1024, G.NORM, G.OUT16), ("o_proj", 512, 384, G.NONE, G.ACC),
                ("gate_up", 384, 2048, G.NORM, G.OUT16), ("down", 1024, 384, G.SWIGLU, G.ACC)],
    "8b": [("qkv", 4096, 6144, G.NORM, G.OUT16), ("o_proj", 4096, 4096, G.NONE, G.ACC),
           ("gate_up", 4096, 24576, G.NORM, G.OUT16), ("down", 12288, 4096, G.SWIGLU, G.ACC)],
}


def make_product(K, N, pro, epi, gemm, rng):
    """-> (launchers {fused, unfused, cublas}, validate() -> (max err, bound), weight bytes)."""
    dev = cuda.to_device
    w16 = L.ref_encode16(rng.standard_normal((N, K)) * 0.02)
    norm_w = (1 + 0.1 * rng.standard_normal(K)).astype(np.float32)
    if pro == G.NORM:
        src = (rng.standard_normal(K) * 3).astype(np.float32)
    elif pro == G.SWIGLU:
        src = L.ref_encode16(rng.standard_normal(2 * K) * 2)
    else:
        src = L.ref_encode16(rng.standard_normal(K))
    y0 = rng.standard_normal(N).astype(np.float32)
    w_d, src_d, nw_d = dev(w16), dev(src), dev(norm_w)
    y_d = cuda.device_array(N, np.uint16) if epi == G.OUT16 else dev(y0)
    a16 = cuda.device_array((1, K), np.uint16)  # the unfused path's 16-bit input
    y2 = cuda.device_array((1, N), np.uint16) if epi == G.OUT16 else dev(y0[None])

    def fused(st):
        G.launch_gemv(src_d, w_d, y_d, st, prologue=pro, epilogue=epi, norm_w=nw_d, eps=1e-6)

    def cublas(st):
        gemm(a16 if pro != G.NONE else src_d.reshape(1, K), w_d, y2, accumulate=epi == G.ACC)

    def unfused(st):
        if pro == G.NORM:
            L.launch_rms_norm(src_d.reshape(1, K), nw_d, 1e-6, a16, st)
        elif pro == G.SWIGLU:
            L.launch_swiglu(src_d.reshape(1, 2 * K), a16, st)
        cublas(st)

    def validate():
        if epi == G.ACC:
            y_d.copy_to_device(y0)
        fused(cuda.default_stream())
        cuda.synchronize()
        got = y_d.copy_to_host()
        got = L.ref_decode16(got).astype(np.float64) if epi == G.OUT16 else got.astype(np.float64)
        a = L.ref_decode16(G.gemv_input16(src, prologue=pro, norm_w=norm_w, eps=1e-6)).astype(np.float64)
        wf = L.ref_decode16(w16).astype(np.float64)
        ref = wf @ a + (y0 if epi == G.ACC else 0)
        err = np.abs(got - ref)
        return float(err.max()), bool(np.all(err <= G.gemv_bound(wf, a, ref, prologue=pro, epilogue=epi)))

    return {"fused": fused, "unfused": unfused, "cublas": cublas}, validate, N * K * 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--repeats", type=int, default=50, help="launches per captured graph")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gemv.json")
    args = ap.parse_args()
    from coldkv.runtime.gemm import CublasGemm

    stream = cuda.stream()
    gemm = CublasGemm(stream)
    rng = np.random.default_rng(0)
    nsm = cuda.get_current_device().MULTIPROCESSOR_COUNT
    name = cuda.get_current_device().name
    doc = {"command": "python " + " ".join(sys.argv), "device": name.decode() if isinstance(name, bytes) else name,
           "commit": git_commit(args.commit), "versions": versions(), "repeats": args.repeats,
           "rounds": args.rounds, "results": []}
    for shape in args.shapes:
        for name, K, N, pro, epi in SHAPES[shape]:
            launch, validate, wbytes = make_product(K, N, pro, epi, gemm, rng)
            err, valid = validate()
            n = max(4, wbytes // 8 // 4 * 4)
            src, dst = cuda.to_device(np.full(n, 1.5, np.float32)), cuda.device_array(n, np.float32)
            fns = dict(launch, copy=lambda st, src=src, dst=dst: copy_v4_kernel[nsm * 8, 256, st](src, dst))
            samples: dict = {}
            for _ in range(args.rounds):
                for k, us in time_round(fns, args.repeats, stream).items():
                    samples.setdefault(k, []).append(us)
            us = {k: float(np.median(v)) for k, v in samples.items()}
            row = {"shape": shape, "product": name, "K": K, "N": N, "prologue": pro, "epilogue": epi,
                   "valid": valid, "max_abs_err": err, "weight_bytes": wbytes,
                   **{f"{k}_us": round(v, 3) for k, v in us.items()},
                   "fused_vs_unfused": round(us["unfused"] / us["fused"], 3),
                   "fused_vs_cublas": round(us["cublas"] / us["fused"], 3),
                   "fused_of_copy": round(us["copy"] / us["fused"], 3),
                   "rounds_us": {k: [round(x, 3) for x in v] for k, v in samples.items()}}
            print(f"{shape:8s} {name:8s} K {K:6d} N {N:6d} valid={valid} fused {us['fused']:7.2f} us, "
                  f"unfused {us['unfused']:7.2f}, cublas {us['cublas']:7.2f}, copy {us['copy']:7.2f}", flush=True)
            doc["results"].append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")
    return 0 if all(r["valid"] for r in doc["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
