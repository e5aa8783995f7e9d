"""Time the CUDA forward pass's per-token kernels (numba_kernels/layers.py) against a copy of the
same bytes, validate first (llm.c style). No GPU is needed for --small (the simulator).

    python bench/layers.py --commit C                       # the bundled model, one 8192-token chunk
    python bench/layers.py --commit C --variants old=variants.layers_05336cd --rounds 5
                                                            # an A/B: the modules take turns each round
    NUMBA_ENABLE_CUDASIM=1 python bench/layers.py --small   # smoke run

Each op runs at a prefill chunk's shapes (--model's config.json, --tokens rows): rms_norm over the
hidden size, qkv_rope_append into K/V pages of each --formats table (and its calibration pass,
`qkv_calib`, writing fp32 K/V instead) and the 4-bit scales' calibration from those (`kv_gscale`),
swiglu over the MLP's gate|up (the attention output's bf16 rounding, round16 until session 30, is
written by the attention kernels now). A round
captures --repeats launches of each op into a CUDA graph (a Numba launch costs 20-50 us of
Python, longer than most of these kernels) and times one replay with CUDA events; the
copy kernel (bench/codecs.py's copy_v4) of the op's bytes runs the same way in the same round.
Per op: median us per launch over the rounds, bytes moved (unique bytes read + written, napkin
math in `bytes_moved`), GB/s, and `of_copy` = copy time / op time (1.0: as fast as moving its
bytes). Repeated launches find their inputs in L2 when they fit (50 MB on an H200), as a prefill
chunk's kernels do after the GEMM that wrote them; the copy of the same bytes does too.
Writes bench/results/layers.json (or --out; under the simulator only --out) with the command, shapes,
device, versions, commit.
Session 16's prefill profile (32k, nvfp4) had qkv_rope_append at ~90 us a call against ~18 us of
bytes, swiglu 41, rms_norm 14, to_bf16 12, kv_amax 55 (bench/results/logs/prefill_profile_nvfp4_59436ef.json).
For the A/B against the kernels before session 17: `git show 05336cd:coldkv/numba_kernels/layers.py >
bench/variants/layers_05336cd.py` (bench/variants is git-ignored; carry it to the device).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from numba import cuda

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchutil import gemm_out16, git_commit, layers_today  # noqa: E402

SIM = bool(os.environ.get("NUMBA_ENABLE_CUDASIM"))


def _load(name: str, path: Path):
    """A module from a file (bench/codecs.py: `import codecs` is the standard library's)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

if SIM:  # the simulator lacks warp shuffles
    sys.path.insert(0, str(ROOT / "tests"))
    __import__("cudasim_warp").install()

copy_v4_kernel = _load("bench_codecs", ROOT / "bench" / "codecs.py").copy_v4_kernel  # the codecs' baseline

import coldkv  # noqa: E402
from coldkv.numba_kernels import layers as L  # noqa: E402
from coldkv.numba_kernels.fp import global_scale_for  # noqa: E402
from coldkv.numba_kernels.quant import FORMAT_IDS, pool_arrays  # noqa: E402
from coldkv.runtime.loader import load_args  # noqa: E402
from coldkv.runtime.rope import Rope  # noqa: E402


def make_ops(a, T: int, formats: list[str], page_tokens: int, rng) -> dict:
    """{name: (launch(module, stream), outputs() -> host arrays, bytes moved)} over shared device
    buffers; each launch recomputes its outputs from inputs it never writes."""
    hd, nq, nkv, dim, inter = a.head_dim, a.num_attention_heads, a.num_key_value_heads, a.hidden_size, a.intermediate_size
    f32 = np.float32
    dev = cuda.to_device
    x = dev(rng.standard_normal((T, dim)).astype(f32))
    w = dev((1 + 0.1 * rng.standard_normal(dim)).astype(f32))
    h16 = cuda.device_array((T, dim), np.uint16)
    # the QKV and gate|up GEMM outputs: 16-bit bits since session 30 (gemm_out16), float32 before;
    # the same values either way (the float32 ones are the 16-bit ones decoded)
    qkv16 = L.ref_encode16(rng.standard_normal((T, (nq + 2 * nkv) * hd)))
    qkv16d, qkv32 = dev(qkv16), dev(L.ref_decode16(qkv16))
    empty = dev(np.zeros(0, f32))
    qn, kn = (dev((1 + 0.1 * rng.standard_normal(hd)).astype(f32)) for _ in range(2))
    cos, sin = (dev(t) for t in Rope(a.rope, hd).cos_sin(np.arange(T)))
    pos = dev(np.array([0, T], np.int32))
    q = cuda.device_array((T, nq, hd), f32)
    kv = cuda.device_array((2, T, nkv, hd), f32)
    gscale = dev(np.full((2, nkv), global_scale_for(8.0), f32))
    gu16 = L.ref_encode16(rng.standard_normal((T, 2 * inter)) * 3)
    gu16d, gu32 = dev(gu16), dev(L.ref_decode16(gu16))
    act = cuda.device_array((T, inter), np.uint16)
    eps = a.rms_norm_eps
    norm = (qn, kn) if a.qk_norm else (empty, empty)
    bias = dev(rng.standard_normal(qkv16.shape[1]).astype(f32)) if a.attention_bias else empty

    ops = {
        "rms_norm": (lambda m, st: m.launch_rms_norm(x, w, eps, h16, st), lambda: [h16.copy_to_host()],
                     T * dim * (4 + 2)),
        "swiglu": (lambda m, st: m.launch_swiglu(gu16d if gemm_out16(m) else gu32, act, st),
                   lambda: [act.copy_to_host()], T * inter * (4 + 2)),
    }
    kv_in = dev(rng.standard_normal((2, T, nkv, hd)).astype(f32))
    two_level, g_out, parts = dev(np.ones(2, np.int32)), cuda.device_array((2, nkv), f32), {}

    def gscale_launch(m, st):  # each module's own slice count (the simulator: 4, a thread per GPU thread)
        if m not in parts:
            parts[m] = cuda.device_array((2, nkv, 4 if SIM else m.GSCALE_SLICES), f32)
        m.launch_kv_gscale(kv_in, pos, two_level, g_out, parts[m], st)

    ops["kv_gscale"] = (gscale_launch, lambda: [g_out.copy_to_host()], 2 * T * nkv * hd * 4)
    qkv_in = T * (nq + 2 * nkv) * hd * 2 + T * hd * 4  # qkv rows (16-bit) + cos/sin rows
    npages = -(-T // page_tokens)
    for i, f in enumerate(formats):
        fid = FORMAT_IDS[f]
        pools = []
        for plane in range(2):
            codes, scales = pool_arrays(f, nkv * npages, page_tokens, hd)
            table = rng.permutation(nkv * npages).reshape(nkv, npages).astype(np.int32)  # scattered pages
            pools.append((fid, dev(table), dev(codes), dev(scales)))
        row_bytes = sum(arr.shape[2] * arr.dtype.itemsize for arr in pools[0][2:])

        def launch(m, st, pools=pools, write=True):
            m.launch_qkv_rope_append(qkv16d if gemm_out16(m) else qkv32, bias, *norm, cos, sin, pos, eps, q, kv,
                                     pools[0], pools[1], gscale, write, st)

        ops[f"qkv_rope_append:{f}"] = (launch, lambda pools=pools: [q.copy_to_host()] + [
            arr.copy_to_host() for p in pools for arr in p[2:]], qkv_in + T * nq * hd * 4 + 2 * T * nkv * row_bytes)
        if i == 0:  # the calibration pass: fp32 K/V out, no pages
            ops["qkv_calib"] = (lambda m, st, launch=launch: launch(m, st, write=False),
                                lambda: [q.copy_to_host(), kv.copy_to_host()], qkv_in + T * (nq + 2 * nkv) * hd * 4)
    return ops


def time_round(fns: dict, repeats: int, stream) -> dict:
    """{key: us per launch} of one round: each fn captured `repeats` times in one graph, replayed once
    (warm) and once timed; keys take turns in the given order."""
    from coldkv.runtime.cuda_graph import CapturedGraph

    out = {}
    for key, fn in fns.items():
        if SIM:
            t0 = time.perf_counter()
            fn(stream)
            out[key] = (time.perf_counter() - t0) * 1e6
            continue
        g = CapturedGraph(stream, lambda: [fn(stream) for _ in range(repeats)])
        g.launch()
        e0, e1 = cuda.event(timing=True), cuda.event(timing=True)
        e0.record(stream)
        g.launch()
        e1.record(stream)
        e1.synchronize()
        out[key] = cuda.event_elapsed_time(e0, e1) * 1e3 / repeats
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=coldkv.DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=8192, help="rows of the pass (the bundled model's prefill chunk)")
    ap.add_argument("--formats", nargs="+", default=["nvfp4", "int8", "bf16"], help="K = V format of the append")
    ap.add_argument("--page-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20, help="launches per captured graph")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="", help="name=module,... other versions of layers.py to time in the same "
                    "rounds (bench/ is on sys.path: variants.layers_X)")
    ap.add_argument("--small", action="store_true", help="4 rows, 1 round (smoke test; the simulator)")
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", type=Path, help="default: bench/results/layers.json on a GPU; under the simulator "
                    "nothing is written unless asked (its timings are not measurements)")
    args = ap.parse_args()
    if args.small:
        args.tokens, args.rounds, args.repeats = 4, 1, 1
    a = load_args(args.model)
    mods = {"main": L}
    for spec in filter(None, args.variants.split(",")):
        name, _, path = spec.partition("=")
        mods[name] = layers_today(importlib.import_module(path))
    rng = np.random.default_rng(0)
    ops = make_ops(a, args.tokens, args.formats, args.page_tokens, rng)
    stream = cuda.stream()

    # validate: every module's outputs bit-identical to main's (same math, same order)
    valid = {}
    for op, (launch, outputs, _) in ops.items():
        launch(L, stream)
        stream.synchronize()
        ref = outputs()
        valid[f"{op}@main"] = True
        for name, m in mods.items():
            if m is L:
                continue
            launch(m, stream)
            stream.synchronize()
            valid[f"{op}@{name}"] = all(np.array_equal(r, g, equal_nan=True) for r, g in zip(ref, outputs()))
    bad = [k for k, ok in valid.items() if not ok]
    print("outputs identical to main's:", "all" if not bad else f"not for {bad}", flush=True)

    # copies of each op's bytes (n floats read + written = bytes moved)
    nsm = 4 if SIM else cuda.get_current_device().MULTIPROCESSOR_COUNT
    copies = {}
    for op, (_, _, nbytes) in ops.items():
        n = max(4, nbytes // 8 // 4 * 4)
        src, dst = cuda.to_device(np.full(n, 1.5, np.float32)), cuda.device_array(n, np.float32)
        copies[op] = (lambda st, src=src, dst=dst: copy_v4_kernel[nsm * 8, 256, st](src, dst), 8 * n)

    samples: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        fns = {}
        for op, (launch, _, _) in ops.items():
            fns[f"{op}@copy"] = copies[op][0]
            for name, m in mods.items():
                fns[f"{op}@{name}"] = (lambda st, launch=launch, m=m: launch(m, st))
        for k, us in time_round(fns, args.repeats, stream).items():
            samples.setdefault(k, []).append(us)

    results = []
    for op, (_, _, nbytes) in ops.items():
        copy_us = float(np.median(samples[f"{op}@copy"]))
        for name in mods:
            us = float(np.median(samples[f"{op}@{name}"]))
            results.append({"op": op, "module": name, "us": round(us, 3), "bytes_moved": int(nbytes),
                            "GBps": round(nbytes / us / 1e3, 1), "copy_us": round(copy_us, 3),
                            "of_copy": round(copy_us / us, 3), "identical_to_main": valid[f"{op}@{name}"],
                            "rounds_us": [round(v, 3) for v in samples[f"{op}@{name}"]]})
            print(f"{op:24s} {name:8s} {us:9.2f} us  {nbytes / us / 1e3:7.0f} GB/s  {copy_us / us:.2f}x copy",
                  flush=True)

    import numba

    meta = {"command": " ".join([Path(sys.executable).name] + sys.argv), "commit": git_commit(args.commit),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
            "numpy": np.__version__, "numba": numba.__version__, "simulator": SIM,
            "modules": {k: m.__name__ for k, m in mods.items()},
            "shapes": {"tokens": args.tokens, "hidden": a.hidden_size, "q_heads": a.num_attention_heads,
                       "kv_heads": a.num_key_value_heads, "head_dim": a.head_dim, "intermediate": a.intermediate_size,
                       "page_tokens": args.page_tokens, "repeats": args.repeats, "rounds": args.rounds}}
    if not SIM:
        d = cuda.get_current_device()
        meta["device"] = d.name.decode() if isinstance(d.name, bytes) else str(d.name)
    if args.out is None:
        if SIM:
            print("simulator: no file written (pass --out to keep one)")
            return
        args.out = ROOT / "bench" / "results" / "layers.json"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**meta, "results": results}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
