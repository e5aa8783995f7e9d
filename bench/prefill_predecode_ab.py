"""A/B in one process: a long nvfp4 prefill with the 4-bit planes pre-decoded once per chunk and
layer vs decoded by every query block, both with the fa kernel (H200; "auto" there is "wg",
which always decodes in the block).

    python bench/prefill_predecode_ab.py --commit HASH --prompt 32768 --out $OUT/prefill_predecode_ab.json

Two CUDABackends of the bundled model; each runs backend.prefill of the prompt 5 times on a new
cache (run 1 compiles, run 2 captures the graphs, runs 3-5 replay them); the second sets its
arena's prefill scratch to None, so its kernels decode per block. Reports wall times, tokens/s
from the median of runs 3-5, and whether the two variants' logits are bitwise equal.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchutil import git_commit, prompt_ids  # noqa: E402

import coldkv  # noqa: E402
from coldkv.runtime.cuda_backend import CUDABackend  # noqa: E402
from coldkv.runtime.kv_table import resolve_table  # noqa: E402
from coldkv.runtime.tokenizer import Tokenizer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=32768)
    ap.add_argument("--table", default="nvfp4")
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prefill_predecode_ab.json")
    a = ap.parse_args()
    from numba import cuda

    model, n = coldkv.DEFAULT_MODEL, a.prompt
    ids = np.array(prompt_ids(Tokenizer.from_dir(model), n), np.int64)
    res, logits = {}, {}
    for name in ("predecode", "decode_per_block"):
        backend = CUDABackend(model, prefill_attention="fa")
        table = resolve_table(a.table, backend.args.num_hidden_layers)
        walls = []
        for _ in range(5):
            cache = backend.new_cache(table, n + 1)
            if name == "decode_per_block":
                cache.arena.prefill_scratch = None
            cuda.synchronize()
            t = time.perf_counter()
            out = backend.prefill(ids, cache)
            cuda.synchronize()
            walls.append(time.perf_counter() - t)
            assert name not in logits or np.array_equal(out, logits[name])
            logits[name] = out
            del cache
        res[name] = {"walls_ms": [round(1000 * w, 2) for w in walls],
                     "tok_s_median_last3": round(n / float(np.median(walls[2:])), 1)}
        del backend
    dev = cuda.get_current_device().name
    row = {"command": "python " + " ".join(sys.argv), "device": dev.decode() if isinstance(dev, bytes) else dev,
           "commit": git_commit(a.commit), "prompt": n, "table": a.table,
           "logits_bitwise_equal": bool(np.array_equal(logits["predecode"], logits["decode_per_block"])), **res}
    print(json.dumps(row))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main()
