"""Offline SASS report of decode-kernel builds: registers, spills, and the order of a chunk's loads
and MMAs (no GPU needed).

    PATH=$PATH:<dir of nvdisasm> python bench/ptxas_decode.py --formats int8 nvfp4 --builds default qs96 qs128

Per build (a name of bench/attention_decode.py's variants, or "default": the kernel paged_attention_cuda
runs; attention_mma's device-position build at --G / --D, default G 4 and d 128 as the benchmark's
32/8/128, at the build's register cap, none where it has none):
registers, spilled bytes, the chunk loop's instructions per 16 tokens (the body of the backward
branch with the most MMAs; the rare rescale and lane 0's copies included), and from the first
128-bit load on (the chunk loop's first K load) the
run of loads (L: LDG, and LDS: q in shared memory, the bulk ring's reads; 128-bit ones counted as
such) and MMAs (I: IMMA, H: HMMA) in program order,
e.g. `L8 I8 H8`: the chunk's K and V loads all issue before its first MMA, so it waits for memory
once; `L4 I3 L4 I5 H8`: V's loads wait behind K's first MMAs, i.e. for K's data (twice a chunk).
The int8 decode waits on its loads (kernels.md "Where each kernel stands"), so this order is
what a build changes (session 21: qs128 issues all 8, qs96 serializes K's two tiles and V).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ptxas_prefill import assemble, prepare, tool_args  # noqa: E402

from attention_decode import _VK  # noqa: E402  (the benchmark's variants: one name, one build)

# the tensor-core decode builds among them: "default" (`_MMA_TUNED`'s), or a variant's knobs
BUILDS = ["default"] + [v for v, kw in _VK.items() if kw.get("kernel") == "mma" and "ws_splits" not in kw]
_OP = re.compile(r"\b(LDG\.E\.128|LDG\.E|LDS\.128|LDS\.64|LDS|IMMA|HMMA)\b")


def load_mma_runs(sass: str) -> str:
    """Runs of loads and MMAs from the first 128-bit load on: 'L8 I8 H8' (L counts LDG, with
    the 128-bit ones in brackets when some are narrower)."""
    ops = _OP.findall(sass)
    first = "LDS.128" if "LDS.128" in ops else "LDG.E.128"  # (the bulk ring's builds read shared memory)
    ops = ops[ops.index(first):] if first in ops else ops
    runs: list[list] = []
    for op in ops:
        kind = "L" if op.startswith("LD") else op[0]
        if not runs or runs[-1][0] != kind:
            runs.append([kind, 0, 0])
        runs[-1][1] += 1
        runs[-1][2] += op.endswith(".128")
    return " ".join(f"{k}{n}" + (f"({w})" if k == "L" and w != n else "") for k, n, w in runs)


_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_LABEL = re.compile(r"^\s*\.(L_x_\d+):")


def chunk_loop(sass: str) -> tuple[int, int]:
    """(instructions, MMAs) of the chunk loop: the backward branch's body with the most HMMA / IMMA
    (the rare rescale and lane 0's copy issue included, as they sit in it)."""
    ops, labels = [], {}
    for line in sass.splitlines():
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = len(ops)
        m = _INS.search(line)
        if m:
            ops.append((m.group(2), m.group(3)))
    best = (0, 0)
    for i, (op, rest) in enumerate(ops):
        target = re.search(r"\.(L_x_\d+)", rest) if op.startswith("BRA") else None
        if target and labels.get(target.group(1), i + 1) <= i:
            body = ops[labels[target.group(1)]:i + 1]
            mmas = sum(o.startswith(("HMMA", "IMMA")) for o, _ in body)
            best = max(best, (mmas, -len(body)))
    return -best[1], best[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", nargs="+", default=["int8"], help="K = V format: bf16 int8 nvfp4 iso3")
    ap.add_argument("--builds", nargs="+", default=["default", "qs96", "qs128"], choices=sorted(BUILDS))
    ap.add_argument("--G", type=int, default=4, help="q heads per kv head")
    ap.add_argument("--D", type=int, default=128, help="head_dim")
    tool_args(ap)
    args = ap.parse_args()
    out = prepare(args)
    from coldkv.numba_kernels import attention_mma as AM
    from coldkv.numba_kernels.attention_cuda import mma_decode_build
    from coldkv.numba_kernels.quant import FORMAT_IDS

    for name in args.formats:
        f = FORMAT_IDS[name]
        for build in args.builds:
            kw = {} if build == "default" else _VK[build]
            tiles, cap, pipe, qsmem, bulk, tm = mma_decode_build(f, f, args.G, args.D, kw.get("mma_tiles", 0),
                                                                 kw.get("max_registers"), kw.get("mma_pipe"),
                                                                 kw.get("mma_qsmem"), kw.get("mma_bulk"),
                                                                 kw.get("mma_tm"))
            k8 = kw.get("mma_k8", True) and AM.supports_k8(f, args.G, args.D)
            try:
                kern = AM.get_kernel(f, f, args.G, args.D, True, tiles, cap, kw.get("mma_u64", True), pipe, k8,
                                     qsmem, bulk, tm, kw.get("mma_pdl", False))
            except ValueError as exc:  # a build this format / shape does not have
                print(f"{name:6s} G {args.G} d {args.D} {build:8s} {exc}", flush=True)
                continue
            info, sass = assemble(kern.py_func, AM.kernel_sig(f, f, True), out / f"decode_{name}_{build}",
                                  args.ptxas, maxrregcount=cap or 0)
            regs = re.search(r"Used (\d+) registers", " ".join(info))
            spill = re.search(r"(\d+) bytes spill stores", " ".join(info))
            n, mmas = chunk_loop(sass) if sass else (0, 0)
            per16 = f"loop {n * 2 // (tiles or 2):4d} a 16 tokens ({mmas} MMAs) | " if n else ""
            print(f"{name:6s} G {args.G} d {args.D} {build:8s} {regs.group(1) if regs else '?':>4s} registers, "
                  f"{spill.group(1) if spill else '?':>4s} B spilled | {per16}"
                  f"{load_mma_runs(sass) if sass else '(no nvdisasm)'}", flush=True)


if __name__ == "__main__":
    main()
