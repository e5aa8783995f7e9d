"""Compile a kernel module's PTX_SIGNATURES for sm_90 offline and print, per kernel, what ptxas
and the SASS say about registers, spills and memory order (no GPU needed).

    PATH=$PATH:<dir of nvdisasm> python bench/ptxas_kernels.py coldkv.numba_kernels.layers [--sass DIR]

Per kernel: registers, stack / spills, and with nvdisasm on PATH the SASS's global loads (LDG/LD),
stores (STG/ST) and `loads after a store`: loads placed after some store in the SASS's static order
(a loop's next trip is not counted). Numba arrays may alias, so neither NVVM nor ptxas moves a load
above a store: each such load waits for the memory latency of what came before (docs/kernels_log.md
"Per-token kernels, session 17"). Session 16's layers.py (05336cd): rms_norm 8 of 15 loads,
swiglu / to_bf16 / add_bias 4; session 17's: 0, except qkv_rope_append's page-table entry (1) and
the bf16 embed (8: LLVM unrolls its strided loop, so the next trips' loads follow this trip's
stores; a 384-wide row is one trip).
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ptxas_prefill import assemble, prepare, tool_args  # noqa: E402

_LOAD = re.compile(r"\b(LDG|LD)\.E")
_STORE = re.compile(r"\b(STG|ST)\.E")


def memory_order(sass: str) -> tuple[int, int, int]:
    """(global loads, global stores, loads after the first store) in the SASS's program order."""
    loads = stores = after = 0
    for line in sass.splitlines():
        if _STORE.search(line):
            stores += 1
        elif _LOAD.search(line):
            loads += 1
            after += stores > 0
    return loads, stores, after


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="+", help="modules with PTX_SIGNATURES, e.g. coldkv.numba_kernels.layers")
    tool_args(ap)
    args = ap.parse_args()
    out = prepare(args)
    for name in args.modules:
        for i, (fn, sig) in enumerate(importlib.import_module(name).PTX_SIGNATURES):
            if fn.targetoptions.get("device", False):
                continue
            kname = fn.py_func.__name__
            info, sass = assemble(fn.py_func, sig, out / f"{name.rsplit('.', 1)[-1]}_{i}_{kname}", args.ptxas)
            mem = "  LDG {} STG {} loads after a store {}".format(*memory_order(sass)) if sass else ""
            print(f"{name} [{i}] {kname}:{mem}")
            for line in info:
                print("   ", line)


if __name__ == "__main__":
    main()
