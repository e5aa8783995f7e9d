"""Where CUDA prefill time goes: host enqueue vs GPU time per chunk, and attention's share (H200).

    python bench/prefill_breakdown.py --commit HASH      # writes bench/results/prefill_breakdown.json

For each prompt length (bundled model, one KV table):
  sync_per_chunk_s   forward() per chunk (--chunk, default 2048), each waiting for its logits
  pipelined_eager_s  backend.prefill() with graphs=False: chunks enqueued back to back, two in flight
  pipelined_s        backend.prefill(): the same with full chunks replayed from a CUDA graph (the
                     capture, once per cache, is inside the timed interval)
  per chunk (chunks run one at a time, synchronized, so the numbers separate):
    enqueue_ms       host time to enqueue a chunk (Python + ~90 Numba/cuBLAS launches)
    gpu_ms           CUDA-event time of the chunk on the GPU
    attention_ms     the part of gpu_ms spent in the 8 paged-attention calls (events around them)
If enqueue_ms >= gpu_ms the prefill is launch-bound (graphs help); otherwise attention_ms says how
much a faster prefill-attention kernel can give.
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
from numba import cuda  # noqa: E402

import coldkv  # noqa: E402
from coldkv.runtime import cuda_backend as CB  # noqa: E402
from coldkv.runtime.kv_table import resolve_table  # noqa: E402
from coldkv.runtime.tokenizer import Tokenizer  # noqa: E402


class AttentionTimer:
    """Wraps cuda_backend.paged_attention_cuda with events on the backend's stream."""

    def __init__(self, stream):
        self.stream, self.pairs, self.inner = stream, [], CB.paged_attention_cuda

    def __call__(self, *args, **kw):
        a, b = cuda.event(), cuda.event()
        a.record(self.stream)
        out = self.inner(*args, **kw)
        b.record(self.stream)
        self.pairs.append((a, b))
        return out

    def take_ms(self) -> float:
        ms = sum(cuda.event_elapsed_time(a, b) for a, b in self.pairs)
        self.pairs.clear()
        return ms


def per_chunk(backend, ids, table, chunk) -> list[dict]:
    cache = backend.new_cache(table, len(ids))
    s = backend.stream
    timer = AttentionTimer(s)
    CB.paged_attention_cuda = timer
    rows = []
    try:
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            T = len(part)
            pos0 = cache.extend(T)
            cache.sync(s)
            tok = cuda.to_device(part.astype(np.int32))
            pos = cuda.to_device(np.array([pos0], np.int32))
            s.synchronize()
            e0, e1 = cuda.event(), cuda.event()
            e0.record(s)
            t = time.perf_counter()
            backend._step(T, pos0, cache, False, tok=tok, pos=pos, head="logits" if start + chunk >= len(ids) else None)
            enq = time.perf_counter() - t
            e1.record(s)
            e1.synchronize()
            rows.append({"pos0": pos0, "enqueue_ms": 1e3 * enq, "gpu_ms": cuda.event_elapsed_time(e0, e1),
                         "attention_ms": timer.take_ms()})
    finally:
        CB.paged_attention_cuda = timer.inner
    return rows


def timed(fn) -> float:
    cuda.synchronize()
    t = time.perf_counter()
    fn()
    cuda.synchronize()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="4096,32768")
    ap.add_argument("--table", default="bf16")
    ap.add_argument("--chunk", type=int, default=CB.MAX_CHUNK)
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prefill_breakdown.json")
    a = ap.parse_args()
    model = coldkv.DEFAULT_MODEL
    backend, eager = CB.CUDABackend(model), CB.CUDABackend(model, graphs=False)
    tok = Tokenizer.from_dir(model)
    table = resolve_table(a.table, backend.args.num_hidden_layers)
    warm = 2 * a.chunk + 100  # calibration chunk, a full chunk, a short one: every kernel variant
    for b in (backend, eager):
        b.prefill(np.array(prompt_ids(tok, warm)), b.new_cache(table, warm), a.chunk)
    results = []
    for n in [int(x) for x in a.prompts.split(",")]:
        ids = np.array(prompt_ids(tok, n), np.int64)

        def sync_per_chunk():
            cache = backend.new_cache(table, n)
            for start in range(0, n, a.chunk):
                backend.forward(ids[start:start + a.chunk], cache)

        row = {"prompt_tokens": n, "kv_table": a.table, "chunk": a.chunk,
               "sync_per_chunk_s": timed(sync_per_chunk),
               "pipelined_eager_s": timed(lambda: eager.prefill(ids, eager.new_cache(table, n), a.chunk)),
               "pipelined_s": timed(lambda: backend.prefill(ids, backend.new_cache(table, n), a.chunk))}
        chunks = per_chunk(backend, ids, table, a.chunk)
        for key in ("enqueue_ms", "gpu_ms", "attention_ms"):
            v = np.array([c[key] for c in chunks])
            row[key] = {"mean": round(float(v.mean()), 3), "first": round(float(v[0]), 3),
                        "last": round(float(v[-1]), 3)}
        row["pipelined_tok_s"] = round(n / row["pipelined_s"], 1)
        row["sync_per_chunk_tok_s"] = round(n / row["sync_per_chunk_s"], 1)
        row["pipelined_eager_tok_s"] = round(n / row["pipelined_eager_s"], 1)
        print(json.dumps(row), flush=True)
        results.append(row)
    out = {"command": "python " + " ".join(sys.argv), "device": cuda.get_current_device().name.decode()
           if isinstance(cuda.get_current_device().name, bytes) else str(cuda.get_current_device().name),
           "commit": git_commit(a.commit), "model": model.name, "results": results}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
