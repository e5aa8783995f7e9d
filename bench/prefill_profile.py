"""Where a CUDA prefill's time goes, kernel by kernel (H200 + torch for its CUPTI profiler).

    python bench/prefill_profile.py --commit HASH --prompt 32768 --table bf16 --out $OUT/prefill_profile.json

Runs backend.prefill (as `coldkv generate` does: a new cache, chunks of the backend's size) once to
compile and once to capture its graphs; then (new caches of the same size reuse that device
memory and replay the graphs) once timed plainly and once under torch.profiler, which records every kernel of the
process (Numba's, cuBLAS's) through CUPTI. Writes the wall time, the summed GPU time per kernel
name (top --top), the GPU-busy total and wall - busy (time the GPU waited on the host: eager
chunks, graph capture and instantiation, the logits copy), and where that idle time falls
(`gpu_idle`: before the first kernel, between kernels with the largest gaps named, after the last). --host adds one run under cProfile:
the host functions with the most own time (what an eager chunk's ~90 launches cost in Python).
--decode N adds N greedy decode steps after a prompt (graph replays, as `generate` runs them): wall
and GPU-busy ms per token and the kernels by GPU time per token; with --host also N steps of the
pipelined decode (`decode_steps`, the next step enqueued before a token is read): their wall ms a
token and their host functions by own time a step (what the host spends a step when it, not the
GPU, sets the pace).
Both sides' GPU time is split into attention (kernel names with one of ATTENTION_KEYS: our
attention modules, torch's flash / memory-efficient / cuDNN SDPA kernels) and the rest. --hf adds
the same profile of HF transformers' prefill as bench/generate.py times it (bf16, sdpa attention,
one forward of the prompt with logits_to_keep=1), so the gap to HF can be placed: in attention or
in the per-token kernels and GEMMs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchutil import git_commit, prompt_ids, versions  # noqa: E402

import coldkv  # noqa: E402
from coldkv.runtime.cuda_backend import CUDABackend  # noqa: E402
from coldkv.runtime.kv_table import resolve_table  # noqa: E402
from coldkv.runtime.tokenizer import Tokenizer  # noqa: E402


HOST_RANGE = "coldkv.prefill"  # our record_function range; the profiler also lists it as a GPU-side event


def kernel_times(prof, n_top: int) -> tuple[list, float, int]:
    """(the n_top kernels by summed GPU ms, the ms the GPU was busy: the union of kernel intervals,
    the number of kernels) of a torch.profiler run. HOST_RANGE's GPU-side copy is no kernel (at
    b5ee373 it was counted: busy and "other" ms took the whole range's 29.3 ms)."""
    per = defaultdict(lambda: [0.0, 0])
    busy = []
    for e in prof.events():
        name = e.name.lower()
        if e.device_type.name == "CUDA" and e.name != HOST_RANGE and "memcpy" not in name and "memset" not in name:
            per[e.name][0] += (e.time_range.end - e.time_range.start) / 1e3  # us -> ms
            per[e.name][1] += 1
            busy.append((e.time_range.start, e.time_range.end))
    busy.sort()
    merged, cur = 0.0, None
    for s, t in busy:  # union of kernel intervals, us
        if cur is None or s > cur[1]:
            if cur:
                merged += cur[1] - cur[0]
            cur = [s, t]
        else:
            cur[1] = max(cur[1], t)
    if cur:
        merged += cur[1] - cur[0]
    top = sorted(per.items(), key=lambda kv: -kv[1][0])[:n_top]
    return [{"name": n[:120], "ms": round(ms, 3), "calls": c} for n, (ms, c) in top], merged / 1e3, len(busy)


ATTENTION_KEYS = ("attention", "flash", "fmha", "sdpa")  # ours are numba_kernels::attention*


def attention_split(prof) -> dict:
    """GPU ms of a torch.profiler run's attention kernels (a name with one of ATTENTION_KEYS) and
    of every other kernel, summed over calls (overlapping kernels count twice, as in `top`)."""
    every, _, _ = kernel_times(prof, 1 << 30)
    att = [k for k in every if any(s in k["name"].lower() for s in ATTENTION_KEYS)]
    att_ms = sum(k["ms"] for k in att)
    return {"attention_ms": round(att_ms, 3), "other_ms": round(sum(k["ms"] for k in every) - att_ms, 3),
            "attention_kernels": sorted({k["name"][:80] for k in att})}


def hf_profile(model, ids, n_top: int) -> dict:
    """HF transformers' prefill of ids (bench/generate.py's: bf16, sdpa, one forward with
    logits_to_keep=1): wall ms (median of 3 after a warm-up), GPU-busy ms, the top kernels and
    the attention split, from one run under torch.profiler."""
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile

    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16,
                                                           attn_implementation="sdpa").cuda().eval()
    x = torch.tensor([ids.tolist()], device="cuda")
    walls = []
    with torch.no_grad():
        for i in range(4):  # the first warms up (allocator growth, kernel choice)
            torch.cuda.synchronize()
            t = time.perf_counter()
            hf(x, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            hf(x, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
    top, busy_ms, n_kernels = kernel_times(prof, n_top)
    del hf
    torch.cuda.empty_cache()
    return {"wall_ms": round(1e3 * float(np.median(walls[1:])), 2), "gpu_busy_ms": round(busy_ms, 2),
            "kernels": n_kernels, "top": top, **attention_split(prof)}


def gpu_gaps(prof, host_range: str, n_top: int = 8) -> dict | None:
    """Where the GPU waited during the torch.profiler record_function range `host_range`: ms from the
    range's start to the first GPU operation (kernel, copy or memset), between consecutive
    operations (summed; the n_top largest with the operations around them) and from the last one
    to the range's end. None without the range."""
    host = [e for e in prof.events() if e.name == host_range and e.device_type.name == "CPU"]
    if not host:
        return None
    t0, t1 = host[0].time_range.start, host[0].time_range.end
    ops = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type.name == "CUDA" and e.name != host_range and t0 <= e.time_range.start <= t1)
    if not ops:
        return None
    gaps, end, last = [], ops[0][1], ops[0][2]
    for start, stop, name in ops[1:]:
        if start > end:
            gaps.append((start - end, last, name))
        if stop >= end:
            end, last = stop, name
    gaps.sort(key=lambda g: -g[0])
    return {"before_first_ms": round((ops[0][0] - t0) / 1e3, 3), "after_last_ms": round((t1 - end) / 1e3, 3),
            "between_ms": round(sum(g[0] for g in gaps) / 1e3, 3), "between_count": len(gaps),
            "largest": [{"ms": round(g / 1e3, 3), "after": a[:80], "before": b[:80]} for g, a, b in gaps[:n_top]]}


def host_profile(work, per: int = 1) -> list[dict]:
    """work() under cProfile: the 25 functions with the most own time (ms, divided by `per`)."""
    import cProfile
    import pstats
    pr = cProfile.Profile()
    pr.enable()
    work()
    pr.disable()
    st = pstats.Stats(pr).stats  # {(file, line, name): (calls, ncalls, own s, cumulative s, callers)}
    rows = sorted(st.items(), key=lambda kv: -kv[1][2])[:25]
    return [{"fn": f"{Path(f).name}:{ln}:{name}", "calls": v[1] / per, "own_ms": round(1e3 * v[2] / per, 4),
             "cum_ms": round(1e3 * v[3] / per, 4)} for (f, ln, name), v in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=32768)
    ap.add_argument("--table", default="bf16")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--host", action="store_true", help="also profile one run's host time (cProfile)")
    ap.add_argument("--hf", action="store_true", help="also profile HF transformers' prefill of the same prompt "
                    "(its attention against the rest, beside ours)")
    ap.add_argument("--decode", type=int, default=0, help="also profile this many decode steps after the prompt "
                    "(per token: wall, GPU-busy and the kernels)")
    ap.add_argument("--chunk", type=int, help="tokens a prefill pass (a multiple of 1024; default: the "
                    "backend's, prefill_chunk_tokens)")
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prefill_profile.json")
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    model = coldkv.DEFAULT_MODEL
    backend = CUDABackend(model, prefill_chunk=a.chunk)
    table = resolve_table(a.table, backend.args.num_hidden_layers)
    ids = np.array(prompt_ids(Tokenizer.from_dir(model), a.prompt), np.int64)

    def run() -> float:
        cache = backend.new_cache(table, a.prompt + 1)
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.profiler.record_function(HOST_RANGE):  # the host range gpu_gaps measures against
            backend.prefill(ids, cache)
            torch.cuda.synchronize()
        return time.perf_counter() - t

    run()  # compile every variant
    run()  # capture the graphs (kept: the next caches reuse this one's device memory)
    wall_plain = run()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = run()
    top, busy_ms, n_kernels = kernel_times(prof, a.top)
    out = {"command": "python " + " ".join(sys.argv), "device": torch.cuda.get_device_name(),
           "commit": git_commit(a.commit), "versions": versions(), "model": model.name, "prompt_tokens": a.prompt, "kv_table": a.table,
           "chunk_tokens": backend.max_chunk,
           "wall_ms": round(1e3 * wall_plain, 2), "wall_profiled_ms": round(1e3 * wall, 2),
           "gpu_busy_ms": round(busy_ms, 2), "kernels": n_kernels, "top": top, **attention_split(prof),
           "gpu_idle": gpu_gaps(prof, HOST_RANGE)}
    if a.hf:
        out["hf"] = hf_profile(model, ids, a.top)
    if a.decode:  # decode steps after the prompt: graph replays, as generate runs them
        from coldkv.runtime.sampling import Sampler, SamplingParams

        cache = backend.new_cache(table, a.prompt + 2 * a.decode + 3)
        backend.prefill(ids, cache)
        sampler, tok = Sampler(SamplingParams()), int(ids[-1])
        for _ in range(2):  # the first step compiles, the second captures
            tok = backend.decode(tok, cache, sampler)
        t = time.perf_counter()
        for _ in range(a.decode):
            tok = backend.decode(tok, cache, sampler)
        wall = (time.perf_counter() - t) / a.decode
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(a.decode):
                tok = backend.decode(tok, cache, sampler)
        top, busy_ms, n_kernels = kernel_times(prof, a.top)
        out["decode"] = {"steps": a.decode, "wall_ms_per_token": round(1e3 * wall, 4),
                         "gpu_busy_ms_per_token": round(busy_ms / a.decode, 4), "kernels_per_token": n_kernels / a.decode,
                         "top_per_token": [{**k, "ms": round(k["ms"] / a.decode, 4), "calls": k["calls"] / a.decode}
                                           for k in top]}
    if a.host:
        out["host_top_own"] = host_profile(run)
        if a.decode:  # the pipelined decode steps generate runs (decode_steps), per step
            cache = backend.new_cache(table, a.prompt + 2 * a.decode + 3)
            backend.prefill(ids, cache)

            def steps() -> list[int]:
                return list(backend.decode_steps(int(ids[-1]), cache, sampler, a.decode))

            steps()  # warm: this cache's graphs
            cache.trim(a.decode)
            t = time.perf_counter()
            steps()
            out["decode"]["pipelined_wall_ms_per_token"] = round(1e3 * (time.perf_counter() - t) / a.decode, 4)
            cache.trim(a.decode)
            out["decode"]["host_top_own_per_step"] = host_profile(steps, per=a.decode)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
