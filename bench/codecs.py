"""Benchmark the KV codec kernels against a plain copy, validate first (llm.c style).

    python bench/codecs.py                      # H200: append / dequant / requant, >= 1 GiB each
    python bench/codecs.py --ops requant --formats int8,nvfp4 --variants vold=variants.quant_X
                                                # a subset (cheaper device time)
    python bench/codecs.py --ops requant --variants v0=coldkv.numba_kernels.quant+variants.requant_X --rounds 5
                                                # an A/B: the modules take turns in each of 5 rounds
    python bench/codecs.py --small              # smoke run (also under NUMBA_ENABLE_CUDASIM=1)
    python bench/codecs.py --nmse               # CPU: NMSE table for docs/formats.md

GPU mode writes bench/results/codecs.json (or --out): command, shapes, device, versions, commit,
and per (op, format): median ms over --rounds x --repeats (CUDA events; each round's median too), bytes moved, GB/s and the ratio to
the fastest Numba copy kernel measured in the same run (16-byte vectors, grid-stride: the goal's
baseline), once at the start (ratio_to_copy) and in every round beside the op (ratio_to_copy_rounds,
copy_round_ms), and to torch's d2d copy when torch is present. The old one-float-per-thread copy is
measured too (`copy.numba_copy_f32`) for comparison with earlier results.

Napkin math, D=128, 64-token pages (bytes per value): x fp32 4; bf16 2; int8 1 + 4/128;
nvfp4/iso3 0.5 + 1/16; c4g64 0.5 + 1/64 (+4 B per page). Bytes moved = unique bytes read +
written: append reads x and writes codes+scales; dequant reads codes+scales and writes fp32;
requant reads a hot page and writes its c4g64 form (the kernel reads the source twice, the second
time mostly from L1/L2; only unique bytes are counted). Instruction budget at the goal (0.7 x a
~3.6 TB/s copy, 1.05e12 warp-instructions/s on an H200): ~13 x (bytes per value) instructions
per value and thread, i.e. ~60-80 for append/dequant but ~14 for requant from a 4-bit source.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from numba import cuda

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchutil import clocks_under_load, git_commit, lead_timed  # noqa: E402

if os.environ.get("NUMBA_ENABLE_CUDASIM"):  # --small smoke run: the simulator lacks warp shuffles
    sys.path.insert(0, str(ROOT / "tests"))
    __import__("cudasim_warp").install()

from coldkv.numba_kernels.quant import _ld4, _st4  # noqa: E402  (16-byte vector load / store)

FMTS = ["bf16", "int8", "nvfp4", "iso3", "c4g64"]
GIB = 1 << 30


# ------------------------------------------------------------------------------------ NMSE (CPU)
def nmse_table(tokens=4096, head_dim=128, seed=1):
    from coldkv.codecs import FORMATS, dequantize, quantize, requantize

    rng = np.random.default_rng(seed)
    data = {
        "gaussian": rng.standard_normal((tokens, head_dim)).astype(np.float32),
        "laplace": rng.laplace(size=(tokens, head_dim)).astype(np.float32),
    }
    o = rng.standard_normal((tokens, head_dim)).astype(np.float32)
    o[:, [3, 40, 77, 101]] *= 20  # K-like outlier channels
    data["outlier"] = o

    def nmse(y, x):
        return float(((y - x) ** 2).sum() / (x**2).sum())

    table = {}
    for name, x in data.items():
        row = {}
        for f in FMTS:  # hot: one global scale per (layer, head) plane, from its amax
            row[f] = nmse(dequantize(quantize(x, f)), x)
        for f in FMTS[:4]:  # cold: each 64-token page of the hot plane requantized to c4g64
            g = quantize(x, f).global_scale if FORMATS[f][4] else None
            y = [dequantize(requantize(quantize(x[i:i + 64], f, g))) for i in range(0, tokens, 64)]
            row[f"{f}->c4g64"] = nmse(np.concatenate(y), x)
        table[name] = row
    return {"tokens": tokens, "head_dim": head_dim, "seed": seed, "nmse": table}


# ------------------------------------------------------------------------------------ GPU


def timed(fn, repeats):
    """benchutil.lead_timed (median ms, the runs rounded, median host enqueue ms); under the
    simulator, which has no timing events, wall-clock ms (all three from it)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM"):
        fn()
        cuda.synchronize()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(times)), times, float(np.median(times))
    ms, times, host_ms = lead_timed(fn, repeats)
    return ms, [round(t, 4) for t in times], host_ms


@cuda.jit
def copy_kernel(src, dst):
    """The old baseline: one float32 per thread, one launch covers the array (kept for comparison
    with earlier results; it leaves the H200 at ~60% of its copy bandwidth)."""
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


@cuda.jit
def copy_v4_kernel(src, dst):
    """A good copy: 16-byte vectors, grid-stride, 4 independent vectors in flight per thread
    (loads first, then stores). src.size % 4 == 0."""
    n4 = src.shape[0] >> 2
    st = cuda.gridsize(1)
    for i in range(cuda.grid(1), n4, 4 * st):
        a = _ld4(src, (4 * i,))
        b = a
        c = a
        d = a
        if i + st < n4:
            b = _ld4(src, (4 * (i + st),))
        if i + 2 * st < n4:
            c = _ld4(src, (4 * (i + 2 * st),))
        if i + 3 * st < n4:
            d = _ld4(src, (4 * (i + 3 * st),))
        _st4(dst, (4 * i,), a)
        if i + st < n4:
            _st4(dst, (4 * (i + st),), b)
        if i + 2 * st < n4:
            _st4(dst, (4 * (i + 2 * st),), c)
        if i + 3 * st < n4:
            _st4(dst, (4 * (i + 3 * st),), d)


def copy_launchers(n):
    """The Numba copy kernels over n float32 (src filled, not zeros: docs say never time on zeros):
    {name: launch}, and (src, dst)."""
    src, dst = cuda.device_array(n, np.float32), cuda.device_array(n, np.float32)
    src[:] = np.float32(1.5)
    nsm = 4 if os.environ.get("NUMBA_ENABLE_CUDASIM") else cuda.get_current_device().MULTIPROCESSOR_COUNT
    return {
        "numba_copy_f32": (lambda: copy_kernel[math.ceil(n / 256), 256](src, dst)),
        "numba_copy_v4": (lambda: copy_v4_kernel[nsm * 8, 256](src, dst)),  # 2048 threads / SM
    }, (src, dst)


def copy_baselines(variants, buffers, repeats, clocks=lambda fn: None):
    """GB/s of the copy kernels of copy_launchers(n) (its launchers and (src, dst); bytes = read +
    written); ratios use the fastest Numba one (`copy`), the goal's baseline, and torch's d2d copy
    (`torch_d2d`) when present."""
    out = {}
    sims = bool(os.environ.get("NUMBA_ENABLE_CUDASIM"))
    src, dst = buffers
    n = src.size
    for name, fn in variants.items():
        dst[:] = np.float32(0)
        ms, _, host_ms = timed(fn, repeats)
        assert np.array_equal(dst.copy_to_host(), src.copy_to_host()), name
        out[name] = {"bytes": 2 * n * 4, "ms": ms, "enqueue_ms": host_ms, "GBps": 2 * n * 4 / ms / 1e6, "clocks": clocks(fn)}
    try:
        import torch

        if not torch.cuda.is_available() or sims:
            raise ImportError("no CUDA torch")
        a = torch.rand(n, dtype=torch.float32, device="cuda")
        b = torch.empty_like(a)
        b.copy_(a)
        torch.cuda.synchronize()
        ts = []
        for _ in range(repeats):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            b.copy_(a)  # the lead run, as in timed()
            s.record()
            b.copy_(a)
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e))
        tms = float(np.median(ts))
        out["torch_d2d"] = {"bytes": 2 * n * 4, "ms": tms, "GBps": 2 * n * 4 / tms / 1e6}
        del a, b
        torch.cuda.empty_cache()
    except ImportError:
        pass
    best = max((k for k in out if k.startswith("numba")), key=lambda k: out[k]["GBps"])
    out["copy"] = {"kernel": best, **out[best]}
    return out


def run_gpu(args, save):
    """Validate then time every (op, format) of each kernel module (--variants: the same ops from
    other versions of the kernels, timed in the same run); save(results) after each format.
    A variant is a copy of quant.py; since session 14 the requant kernels are in requant.py, so a
    variant made from a newer tree is quant.py + requant.py joined (name=modA+modB): later wins."""
    import importlib
    from types import SimpleNamespace

    from coldkv.numba_kernels import quant, requant

    def joined(*mods):
        return SimpleNamespace(**{k: v for m in mods for k, v in vars(m).items() if not k.startswith("__")},
                               __name__="+".join(m.__name__ for m in mods))

    modules = [("current", joined(quant, requant))]
    for spec in filter(None, args.variants.split(",")):
        name, mods = spec.split("=")
        modules.append((name, joined(*(importlib.import_module(m) for m in mods.split("+")))))
    Q = quant  # the reference and pool layout (the same in every version)

    D, P, H = args.head_dim, args.page_tokens, args.heads
    ws = int(args.gib * GIB)
    T = ws // (4 * H * D)  # x fp32 [T, H, D] is the working set
    T -= T % P
    n_lp = T // P
    results = {"copy": {}, "ops": [], "kernels": {k: getattr(m, "__name__", k) for k, m in modules}}

    # --- data: x [T, H, D] fp32 (a 64 MiB random block tiled on the device), per-head globals
    rng = np.random.default_rng(0)
    block_rows = max(1, min(T, (64 << 20) // (4 * H * D)))
    xb = rng.standard_normal((block_rows, H, D), dtype=np.float32)
    xb[:, :, 3] *= 8
    x = cuda.device_array((T, H, D), np.float32)
    for t0 in range(0, T, block_rows):
        x[t0:t0 + block_rows] = xb[: min(block_rows, T - t0)]
    g = np.array([Q.global_scale_for(np.abs(xb[:, h]).max() * 1.25) for h in range(H)], np.float32)
    d_g = cuda.to_device(g)

    def pool_bytes(f, pages):
        c, s = Q.pool_arrays(f, 1, P, D)
        return pages * (c.nbytes + s.nbytes)

    def clocks(fn):
        """The GPU's SM clock and power while fn runs back to back (nvidia-smi; not under the simulator)."""
        if not args.clocks or os.environ.get("NUMBA_ENABLE_CUDASIM"):
            return None
        return clocks_under_load(fn, sync=cuda.synchronize)

    def record(**r):
        r["GBps"] = r["bytes"] / r["ms"] / 1e6
        r["ratio_to_copy"] = r["GBps"] / results["copy"]["copy"]["GBps"]
        torch_gbs = results["copy"].get("torch_d2d", {}).get("GBps")
        if torch_gbs:
            r["ratio_to_torch_copy"] = r["GBps"] / torch_gbs
        # timed()'s lead run hides the launch only while the launch is quicker than the kernel
        r["launch_bound"] = not os.environ.get("NUMBA_ENABLE_CUDASIM") and r["enqueue_ms"] > 0.8 * r["ms"]
        if r["launch_bound"]:
            print(f"WARNING {r['op']} {r['fmt']}: the host's launch ({r['enqueue_ms']:.3f} ms) is near the kernel's "
                  f"time ({r['ms']:.3f} ms), so the timing may include idle GPU time; use a larger --gib", flush=True)
        results["ops"].append(r)

    def validate(Q, f):
        """device == njit CPU kernel == numpy reference on two pages; compiles the kernels."""
        fid = Q.FORMAT_IDS[f]
        # validate on a small problem: device == njit CPU kernel == numpy reference (tested)
        xs = xb[: 2 * P]
        tab_s = np.arange(H * 2, dtype=np.int32).reshape(H, 2)[:, ::-1].copy()
        c_cpu, s_cpu = Q.pool_arrays(f, H * 2, P, D)
        Q.append_cpu(fid, xs, 0, tab_s, c_cpu, s_cpu, g)
        dc, ds = (cuda.to_device(a) for a in Q.pool_arrays(f, H * 2, P, D))
        Q.launch_append(fid, cuda.to_device(xs), 0, cuda.to_device(tab_s), dc, ds, d_g)
        assert np.array_equal(dc.copy_to_host(), c_cpu) and np.array_equal(ds.copy_to_host(), s_cpu), f
        # ... and dequant / requant of those pages == the reference, before anything is timed
        sp = tab_s.reshape(-1).copy()
        sg = np.repeat(g, 2).astype(np.float32)
        d_out = cuda.device_array((sp.size, P, D), np.float32)
        Q.launch_dequant_pages(fid, dc, ds, cuda.to_device(sp), cuda.to_device(sg), d_out)
        oc0, os0 = Q.pool_arrays("c4g64", sp.size, P, D)
        d_oc, d_os, d_og = cuda.to_device(oc0), cuda.to_device(os0), cuda.device_array(sp.size, np.float32)
        Q.launch_requant_c4g64(fid, dc, ds, cuda.to_device(sp), cuda.to_device(sg), d_oc, d_os, d_og)
        got, goc, gos, gog = d_out.copy_to_host(), d_oc.copy_to_host(), d_os.copy_to_host(), d_og.copy_to_host()
        for i, pg in enumerate(sp):
            ref = Q.ref_dequantize(c_cpu[pg], s_cpu[pg], fid, sg[i], D)
            assert np.array_equal(got[i].view(np.uint32), ref.view(np.uint32)), (f, "dequant")
            rc, rs, rg = Q.ref_requantize(c_cpu[pg], s_cpu[pg], fid, sg[i], D)
            assert np.array_equal(goc[i], rc) and np.array_equal(gos[i], rs), (f, "requant")
            assert np.float32(gog[i]) == np.float32(rg), (f, "requant g")

    # compile and validate everything first, then (after --wait-pid: a GPU test run sharing the
    # device) time
    ok = []
    for kname, M in modules:
        try:
            for f in args.formats:
                validate(M, f)
            ok.append((kname, M))
        except Exception as exc:  # a variant that fails is reported, not timed; the rest still runs
            if kname == "current":
                raise
            results.setdefault("failed", {})[kname] = f"{type(exc).__name__}: {exc}"[:2000]
            print(f"{kname} FAILED validation: {exc}", flush=True)
    modules = ok
    print("validated: " + ", ".join(k for k, _ in modules), flush=True)
    if args.wait_pid:
        while os.path.exists(f"/proc/{args.wait_pid}"):
            time.sleep(0.5)
    # --- baselines
    peers, peer_buffers = copy_launchers(ws // 4)
    results["copy"] = copy_baselines(peers, peer_buffers, args.repeats, clocks)
    print("copy GB/s: " + ", ".join(f"{k} {v['GBps']:.0f}" + (f" (SM {v['clocks']['sm_mhz_median']:.0f} MHz)"
                                                              if (v.get("clocks") or {}).get("sm_mhz_median") else "")
                                    for k, v in results["copy"].items() if k != "copy"),
          flush=True)

    # the baseline copy again inside every round of every op: a slow spell of the GPU (seen on the
    # H100 in session 24: one format's requant 15% slower for all five rounds of a run, not in the
    # next) then shows in the copy too, and ratio_to_copy_rounds cancels it
    peer = peers[results["copy"]["copy"]["kernel"]]

    def interleaved(op, f, fns, moved, check, **extra):
        """Time each module's launch of one (op, format) in args.rounds rounds, the modules and the
        copy kernel in turn within each round (same inputs and outputs, so a drift of the GPU's
        clock or temperature hits every module and the copy alike); record each with its median
        over all rounds, its per-round medians and its ratio to the copy of the same rounds, after
        checking its output against the reference."""
        per, host = {k: [] for k in fns}, {k: [] for k in fns}
        copy_rounds = []
        for _ in range(args.rounds):
            for k, fn in fns.items():
                _, times, host_ms = timed(fn, args.repeats)
                per[k].append(times)
                host[k].append(host_ms)
            copy_rounds.append(timed(peer, args.repeats)[1])
        copy_ms = float(np.median([t for r in copy_rounds for t in r]))
        for k, fn in fns.items():
            fn()
            cuda.synchronize()
            check(k)
            raw = [t for r in per[k] for t in r]
            ms = float(np.median(raw))
            record(kernels=k, op=op, fmt=f, ms=ms, bytes=moved, times_ms=raw,
                   round_ms=[float(np.median(r)) for r in per[k]], enqueue_ms=float(np.median(host[k])), clocks=clocks(fn),
                   copy_round_ms=[float(np.median(r)) for r in copy_rounds],
                   ratio_to_copy_rounds=(moved / ms) / (results["copy"]["copy"]["bytes"] / copy_ms), **extra)

    for f in args.formats:
        fid = Q.FORMAT_IDS[f]
        n_rec = len(results["ops"])  # this format's rows start here (printed below)
        # append: the whole x into a shuffled pool (every module writes the same bits: validated)
        table = rng.permutation(H * n_lp).astype(np.int32).reshape(H, n_lp)
        d_table = cuda.to_device(table)
        c0, s0 = Q.pool_arrays(f, 1, P, D)
        codes = cuda.device_array((H * n_lp,) + c0.shape[1:], c0.dtype)
        scales = cuda.device_array((H * n_lp,) + s0.shape[1:], s0.dtype)
        appends = {k: (lambda M=M: M.launch_append(fid, x, 0, d_table, codes, scales, d_g)) for k, M in modules}

        def check_append(k):
            for h, lp in ((0, 0), (H - 1, n_lp - 1), (H // 2, n_lp // 2)):
                rows = xb[(lp * P + np.arange(P)) % block_rows, h]  # x is xb tiled
                rc, rs = Q.ref_quantize(rows, fid, g[h])
                assert np.array_equal(codes[table[h, lp]].copy_to_host(), rc), (k, f, "append")
                if rs.size:  # bf16 has zero scale columns (a 0-size device array copies back oddly)
                    assert np.array_equal(scales[table[h, lp]].copy_to_host(), rs), (k, f, "append")

        if "append" in args.ops:
            interleaved("append", f, appends, T * H * D * 4 + pool_bytes(f, H * n_lp), check_append, shape=[T, H, D])
        else:  # the pool is still filled once
            appends["current"]()
            check_append("current")

        # dequantize every page of the pool into fp32 [n, P, D]
        npages = H * n_lp
        pages = rng.permutation(npages).astype(np.int32)
        gs = g[(np.argsort(table.reshape(-1)) // n_lp)[pages]].astype(np.float32)  # page -> head
        d_pages, d_gs = cuda.to_device(pages), cuda.to_device(gs)
        if "dequant" in args.ops:
            out = cuda.device_array((npages, P, D), np.float32)

            def check_dequant(k):
                for j in (0, npages - 1, npages // 3):
                    ref = Q.ref_dequantize(codes[pages[j]].copy_to_host(), scales[pages[j]].copy_to_host(), fid, gs[j], D)
                    assert np.array_equal(out[j].copy_to_host().view(np.uint32), ref.view(np.uint32)), (k, f, "dequant")

            interleaved("dequant", f, {k: (lambda M=M: M.launch_dequant_pages(fid, codes, scales, d_pages, d_gs, out))
                                       for k, M in modules},
                        pool_bytes(f, npages) + npages * P * D * 4, check_dequant, shape=[npages, P, D])
            del out

        if "requant" in args.ops:
            # requantize to c4g64: as many pages as make >= the working set (pages reused if needed)
            per_page = pool_bytes(f, 1) + pool_bytes("c4g64", 1) + 4
            nreq = max(1, math.ceil(ws / per_page))
            rpages = np.resize(pages, nreq).astype(np.int32)
            rgs = np.resize(gs, nreq).astype(np.float32)
            d_rp, d_rg = cuda.to_device(rpages), cuda.to_device(rgs)
            oc0, os0 = Q.pool_arrays("c4g64", 1, P, D)
            oc = cuda.device_array((nreq,) + oc0.shape[1:], np.uint8)
            os_ = cuda.device_array((nreq,) + os0.shape[1:], np.uint8)
            og = cuda.device_array(nreq, np.float32)

            def check_requant(k):
                for j in (0, nreq - 1, nreq // 2):
                    rc, rs, rg = Q.ref_requantize(codes[rpages[j]].copy_to_host(), scales[rpages[j]].copy_to_host(),
                                                  fid, rgs[j], D)
                    assert np.array_equal(oc[j].copy_to_host(), rc) and np.array_equal(os_[j].copy_to_host(), rs), (k, f)
                    assert np.float32(og[j:j + 1].copy_to_host()[0]) == np.float32(rg), (k, f, "requant")

            interleaved("requant_c4g64", f,
                        {k: (lambda M=M: M.launch_requant_c4g64(fid, codes, scales, d_rp, d_rg, oc, os_, og))
                         for k, M in modules},
                        nreq * per_page, check_requant, shape=[nreq, P, D], source_pages_reused=nreq > npages)
            del oc, os_, og
        del codes, scales
        for r in results["ops"][n_rec:]:
            clk = f"  SM {r['clocks']['sm_mhz_median']:.0f} MHz" if (r.get("clocks") or {}).get("sm_mhz_median") else ""
            rounds = " rounds " + " ".join(f"{t:.3f}" for t in r["round_ms"]) if len(r["round_ms"]) > 1 else ""
            print(f"{r['kernels']:>8} {r['op']:>14} {f:>6}: {r['ms']:8.3f} ms  {r['GBps']:7.0f} GB/s  "
                  f"{r['ratio_to_copy']:.2f}x copy ({r['ratio_to_copy_rounds']:.2f}x its rounds' copy), "
                  f"enqueue {r['enqueue_ms']:.3f} ms{clk}{rounds}",
                  flush=True)
        save(results)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nmse", action="store_true", help="CPU NMSE table only")
    ap.add_argument("--small", action="store_true", help="tiny working set (smoke test)")
    ap.add_argument("--gib", type=float, default=1.0, help="working set per op, GiB")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20, help="timed launches per round (median)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of --repeats; with --variants the "
                    "modules take turns within each round (an A/B that the GPU's drift hits alike)")
    ap.add_argument("--commit", default="", help="git commit to record (when .git is absent)")
    ap.add_argument("--out", default="")
    ap.add_argument("--wait-pid", type=int, default=0, help="time only after this process exits")
    ap.add_argument("--ops", default="append,dequant,requant", help="ops to time (the append still "
                    "runs once to fill the pool)")
    ap.add_argument("--formats", default=",".join(FMTS), help="source formats, comma-separated")
    ap.add_argument("--no-clocks", dest="clocks", action="store_false", help="skip sampling the SM clock "
                    "(nvidia-smi, ~1 s an op) while each op runs back to back")
    ap.add_argument("--variants", default="", help="name=module[+module],... other kernel versions to time "
                    "too: a copy of quant.py (e.g. v306=variants.quant_306a0c7), or of quant.py and requant.py "
                    "joined with + (bench/ is on sys.path)")
    args = ap.parse_args()
    args.ops = [o for o in args.ops.split(",") if o]
    args.formats = [f for f in args.formats.split(",") if f]
    bad = sorted(set(args.ops) - {"append", "dequant", "requant"}) + sorted(set(args.formats) - set(FMTS))
    if bad:
        ap.error(f"unknown op or format: {', '.join(bad)}")
    import numba

    meta = {
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "commit": git_commit(args.commit),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
    }
    if args.nmse:
        res = nmse_table()
        out = Path(args.out or ROOT / "bench/results/codecs_nmse.json")
        print("| data | " + " | ".join(res["nmse"]["gaussian"]) + " |")
        for name, row in res["nmse"].items():
            print(f"| {name} | " + " | ".join(f"{v:.3g}" for v in row.values()) + " |")
        save(out, {**meta, **res})
        return
    if args.small:  # two 64-token pages of 2 heads x 64 (the simulator runs every thread in Python)
        args.heads, args.head_dim, args.repeats = 2, 64, 1
        args.gib = 2 * args.page_tokens * 4 * args.heads * args.head_dim / GIB
    try:
        import numba_cuda

        meta["numba_cuda"] = numba_cuda.__version__
    except ImportError:
        pass
    meta["simulator"] = bool(os.environ.get("NUMBA_ENABLE_CUDASIM"))
    if not meta["simulator"]:
        dev = cuda.get_current_device()
        meta["device"] = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        meta["compute_capability"] = list(dev.compute_capability)
        try:
            meta["driver"] = list(cuda.cudadrv.driver.driver.get_version())
        except Exception:
            pass
        try:
            import torch

            meta["torch"] = torch.__version__
        except ImportError:
            pass
    meta["shapes"] = {"heads": args.heads, "head_dim": args.head_dim, "page_tokens": args.page_tokens,
                      "working_set_GiB": args.gib, "repeats": args.repeats, "rounds": args.rounds}
    if not args.out and (args.small or meta["simulator"]):
        # a smoke run's timings are not measurements: keep bench/results/codecs.json for real ones
        run_gpu(args, lambda res: None)
        print("smoke run: no file written (pass --out to keep one)")
        return
    out = Path(args.out or ROOT / "bench/results/codecs.json")
    run_gpu(args, lambda res: save(out, {**meta, **res}))


def save(out: Path, obj) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(obj, indent=1) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
