"""Where a decode step's time goes: the fixed part against the part that grows with the context.

    python bench/decode_breakdown.py --commit C --formats nvfp4 int8 --out bench/results/logs/x.json

Fitting bench/attention_decode.py's rows (time = a + b * tokens) gives an intercept of ~22 us for
nvfp4 and ~20 us for SDPA on the H100 (29ea3c3), so at 131072 tokens a quarter of the step is not
reading pages. For each format and context this times, each as a CUDA-graph replay after an L2
flush that reads (attention_decode.event_time's clean, the way the grid times its rows since
session 40; files before it flushed by writing, which adds the dirty lines' write-back):
  full       the attention kernel and the split reduce (what the grid reports)
  attention  the attention kernel alone (the reduce replaced by nothing during the capture)
  reduce     the reduce alone, over the partials the attention kernel left
  floor      a graph of one empty one-block kernel: event + graph launch, no work
and SDPA (bf16 K/V, enable_gqa) at the same context. --splits caps the workspace's splits (the
planner otherwise fills one wave of resident blocks) to see what the reduce and the kernel's
epilogue cost per split; --waves plans W waves of resident blocks instead of one (smaller splits
the block scheduler could balance; at e63b7d7 on the H100 every extra wave was slower: the fixed
cost is per block, docs/kernels.md "What to try next", Decode 1). FORMAT@KNOB rows as in attention_decode.py (e.g. nvfp4@pdl: "full" then
has the merge as a dependent launch; "reduce" is always the plain launch).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from numba import cuda

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from attention_decode import Case, capture_graph, event_time, sdpa_step  # noqa: E402
from benchutil import git_commit, versions  # noqa: E402

from coldkv.numba_kernels import attention_cuda as A  # noqa: E402


@cuda.jit
def _empty_kernel(x):
    if cuda.grid(1) == 1 << 30:  # never: a launch that does nothing
        x[0] = 0


def time_graph(torch, launch, flush, repeats):
    s, replay, destroy = capture_graph(torch, launch)
    try:
        with torch.cuda.stream(s):
            return event_time(torch, replay, flush, repeats, clean=True)[0]
    finally:
        destroy()


def breakdown(torch, name, L, shape, splits, flush, repeats, waves=1) -> dict:
    real_resident = A._resident_blocks
    A._resident_blocks = lambda *a, **kw: waves * real_resident(*a, **kw)  # what plan_splits fills
    try:
        return {**_breakdown(torch, name, L, shape, splits, flush, repeats), "waves": waves}
    finally:
        A._resident_blocks = real_resident


def _breakdown(torch, name, L, shape, splits, flush, repeats) -> dict:
    Hq, H, D = shape
    c = Case(torch, name, L, Hq, H, D, seed=L + D)
    if splits:
        c.ws = A.AttentionWorkspace(splits, 1, Hq, D)
    pos = cuda.to_device(np.array([L - 1], np.int32))
    args = list(c.args)
    args[2] = pos

    def attend(nb):
        A.paged_attention_cuda(*args, c.ws, stream=nb, plan_len=L, **c.kw)

    reduce_args = []
    real_reduce = A._reduce

    def recording_reduce(*a, **kw):
        reduce_args[:] = a[:4]
        real_reduce(*a, **kw)

    A._reduce = recording_reduce
    try:
        full = time_graph(torch, attend, flush, repeats)
    finally:
        A._reduce = real_reduce
    A._reduce = lambda *a, **kw: None
    try:
        attention = time_graph(torch, attend, flush, repeats)
    finally:
        A._reduce = real_reduce
    reduce = time_graph(torch, lambda nb: real_reduce(*reduce_args, nb), flush, repeats)
    c.free()
    return {"format": name, "context": L, "shape": f"{Hq}/{H}/{D}", "splits": int(reduce_args[2]),
            "full_us": full, "attention_us": attention, "reduce_us": reduce}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", nargs="*", default=["nvfp4", "int8", "bf16"])
    ap.add_argument("--contexts", type=int, nargs="*", default=[4096, 32768, 131072, 360000])
    ap.add_argument("--shape", default="32/8/128", help="Hq/H/D")
    ap.add_argument("--splits", type=int, nargs="*", default=[0], help="workspace split caps (0: the planner's)")
    ap.add_argument("--waves", type=int, nargs="*", default=[1], help="waves of resident blocks the planner fills")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    shape = tuple(int(x) for x in args.shape.split("/"))
    doc = {"device": torch.cuda.get_device_name(), "commit": git_commit(args.commit),
           "command": " ".join([sys.executable] + sys.argv), "versions": versions(), "results": []}
    flush = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    dummy = cuda.device_array(1, np.int32)
    doc["floor_us"] = time_graph(torch, lambda nb: _empty_kernel[1, 32, nb](dummy), flush, args.repeats)
    print(f"floor {doc['floor_us']:.1f} us", flush=True)
    Hq, H, D = shape
    for L in args.contexts:
        t_sdpa = event_time(torch, sdpa_step(torch, Hq, H, L, D), flush, args.repeats, clean=True)[0]
        for name in args.formats:
            for sp in args.splits:
                for w in args.waves:
                    try:
                        rec = {**breakdown(torch, name, L, shape, sp, flush, args.repeats, w), "sdpa_bf16_us": t_sdpa}
                    except Exception as exc:  # a bench row, not a crash: the others still run
                        rec = {"format": name, "context": L, "split_cap": sp, "waves": w, "error": repr(exc)}
                    doc["results"].append(rec)
                    print(json.dumps(rec), flush=True)
                    Path(args.out).write_text(json.dumps(doc, indent=1))
                    torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
