"""End-to-end generate: coldkv's CUDA backend vs HF transformers `generate` (H200 + torch).

    python bench/generate.py --commit HASH                      # 4k, 32k, 128k; writes bench/results/generate.json
    python bench/generate.py --prompts 4096 --out /tmp/g.json    # quick

The same checkpoint for both (default: the bundled model; for prompts past its 64k context both
load it with YaRN x4 written into a copied config.json). Prompt: the examples' texts tokenized
and repeated to the length. For each prompt length and KV table:
  coldkv  engine.generate on the CUDA backend (prefill in chunks of the backend's size, enqueued back to back,
          full chunks and decode steps replayed from CUDA graphs), greedy, --new tokens;
          prefill_s and decode_s as the engine times them (each decode step ends with the
          GPU-sampled token copied to the host). A short warm-up generate per table runs first
          (Numba compiles each kernel variant once per process; that compile time is not in the
          numbers). Then 1 + max(3, --repeats) generates of the prompt: the first makes a cache of
          a new size and captures its graphs (`*_new_cache` fields), the others reuse its device
          memory and replay them, as a server's later requests do; their median is reported (at
          least three: with two, the median was their mean, and one slow run moved a row by 20%).
  HF      bf16 weights, attn_implementation="sdpa", greedy `generate`; prefill = one forward
          of the prompt (use_cache=True), decode rate = (new - 1) / (time(generate new) -
          time(generate 1)). CUDA-synchronized wall clock, median of --repeats.
Ratios are what to read: both ran in this process on the same GPU. `decode_launch_overhead`:
ms per decode step at 512 tokens with every kernel launched from Python, with a replayed CUDA graph
waiting for each token before the next step, and with the next step's graph enqueued before the
token is read (the default: CUDABackend.decode_steps).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchutil import compile_in_workers, git_commit, prompt_ids, versions  # noqa: E402

import coldkv  # noqa: E402
from coldkv.numba_kernels.attention_cuda import PREFILL_KERNELS  # noqa: E402
from coldkv.runtime.cuda_backend import CUDABackend  # noqa: E402
from coldkv.runtime.engine import generate  # noqa: E402
from coldkv.runtime.kv_table import resolve_table  # noqa: E402
from coldkv.runtime.loader import load_args  # noqa: E402
from coldkv.runtime.tokenizer import Tokenizer  # noqa: E402


def with_yarn(model: Path, factor: float, tmp: Path) -> Path:
    """A copy of the checkpoint directory (weights linked) whose config has YaRN x factor."""
    out = tmp / f"{model.name}-yarn{factor:g}"
    out.mkdir()
    for f in model.iterdir():
        (out / f.name).symlink_to(f.resolve())
    cfg = json.loads((model / "config.json").read_text())
    orig = cfg["max_position_embeddings"]
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig}
    cfg["max_position_embeddings"] = int(orig * factor)
    (out / "config.json").unlink()
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def chunked_backend(model, kern):
    """A CUDA backend for a --prefill-attention name (attention_cuda.prefill_kernel); "NAME@N" runs
    prefill chunks of N tokens (an A/B of the chunk size in one run)."""
    name, _, chunk = kern.partition("@")
    return CUDABackend(model, prefill_attention=name, prefill_chunk=int(chunk) if chunk else None)


def time_coldkv(backend, tok, ids, table, new):
    """-> (prefill tok/s, decode tok/s, generated tokens)."""
    r = generate(backend, tok, ids, table=table, max_new_tokens=new)
    if r.decode_steps != new - 1:
        raise RuntimeError(f"coldkv stopped early ({r.finish_reason})")
    return r.prefill_tokens_per_s, r.decode_tokens_per_s, r.tokens


def warm_up(model: Path, kern: str, table: str, n: int) -> None:
    """The warm-up generate of one (prefill kernel, KV table) before the timed runs: the first
    2 chunks + 100 tokens of the n-token prompt (a calibrating chunk, a full one, a short one), so
    every kernel variant the timed runs use compiles here. Also run by --jobs workers (each loads
    the checkpoint: mind the GPU memory of a large one)."""
    backend = chunked_backend(model, kern)
    tok = Tokenizer.from_dir(model)
    ids = prompt_ids(tok, n)[:2 * backend.prefill_chunk + 100]
    time_coldkv(backend, tok, ids, resolve_table(table, backend.args.num_hidden_layers), 8)


def time_hf(model, torch, ids, new, repeats):
    x = torch.tensor([ids], device="cuda")

    def timed(fn):
        ts = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        return float(np.median(ts))

    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model(x, use_cache=True, logits_to_keep=1)  # warm-up at full length (allocator growth, kernel choice)
        prefill = timed(lambda: model(x, use_cache=True, logits_to_keep=1))
        g1 = timed(lambda: model.generate(x, max_new_tokens=1, min_new_tokens=1, **kw))
        gn = timed(lambda: model.generate(x, max_new_tokens=new, min_new_tokens=new, **kw))
    return len(ids) / prefill, (new - 1) / (gn - g1)


def launch_overhead(model: Path, new: int) -> dict:
    """ms per decode step at a short context (512 prompt tokens, bf16 KV): the same steps launched
    one by one from Python, replayed from a captured CUDA graph a token at a time, and replayed one
    step ahead of the host (pipelined)."""
    out = {"prompt_tokens": 512, "new_tokens": new, "kv_table": "bf16"}
    tok = Tokenizer.from_dir(model)
    ids = prompt_ids(tok, 512)
    tokens = {}
    for name, kw in (("eager", dict(graphs=False, pipelined_decode=False)), ("graph", dict(pipelined_decode=False)),
                     ("graph_pipelined", {})):
        backend = CUDABackend(model, **kw)
        table = resolve_table("bf16", backend.args.num_hidden_layers)
        time_coldkv(backend, tok, ids, table, 8)  # compile
        _, dec, tokens[name] = time_coldkv(backend, tok, ids, table, new)
        out[f"{name}_ms_per_token"] = round(1000 / dec, 3)
    out["tokens_equal"] = len({tuple(t) for t in tokens.values()}) == 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=coldkv.DEFAULT_MODEL)
    ap.add_argument("--prompts", default="4096,32768,131072")
    ap.add_argument("--tables", default="bf16,nvfp4")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prefill-attention", default="auto",
                    help=f"prefill kernels to time: auto (attention_cuda.prefill_kernel), {', '.join(PREFILL_KERNELS)}, each with "
                    "an optional @N (prefill chunks of N tokens, a multiple of 1024, e.g. auto@16384); each "
                    "row says which, and whether its greedy tokens equal the first kernel's")
    ap.add_argument("--no-launch-ab", dest="launch_ab", action="store_false",
                    help="skip the eager / graph / pipelined decode A/B at 512 tokens (~1 min of compiles)")
    ap.add_argument("--jobs", type=int, default=1, help="run the warm-ups (the compiles) in this many processes "
                    "first, each with its own copy of the weights (benchutil.compile_in_workers)")
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "generate.json")
    a = ap.parse_args()
    import torch
    import transformers

    results = []
    graph_ab = launch_overhead(a.model, a.new) if a.launch_ab else None
    print(json.dumps(graph_ab), flush=True)
    tmp = Path(tempfile.mkdtemp())
    try:
        for n in [int(x) for x in a.prompts.split(",")]:
            model = a.model
            ctx = load_args(model).max_position_embeddings
            if n + a.new > ctx:
                model = with_yarn(model, 2 ** int(np.ceil(np.log2((n + a.new) / ctx))), tmp)
            tok = Tokenizer.from_dir(model)
            ids = prompt_ids(tok, n)
            kernels = a.prefill_attention.split(",")
            # a backend per prefill kernel: each captures graphs of passes it has compiled
            backends = {kern: chunked_backend(model, kern) for kern in kernels}
            n_layers = backends[kernels[0]].args.num_hidden_layers
            jobs = [(model, kern, name, n) for name in a.tables.split(",") for kern in kernels]
            for err in compile_in_workers(warm_up, jobs, a.jobs):
                print("warm-up worker:", err, flush=True)  # compiled again below
            for name in a.tables.split(","):  # compile (or load) every kernel variant the timed runs use
                for kern in kernels:
                    warm = ids[:2 * backends[kern].prefill_chunk + 100]  # calibration chunk, a full chunk, a short one
                    time_coldkv(backends[kern], tok, warm, resolve_table(name, n_layers), 8)
            hf = transformers.AutoModelForCausalLM.from_pretrained(
                model, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
            hf_pre, hf_dec = time_hf(hf, torch, ids, a.new, a.repeats)
            del hf
            torch.cuda.empty_cache()
            for name in a.tables.split(","):
                first = None
                for kern in kernels:
                    # run 1 captures the graphs for this cache size; runs 2.. reuse its arena and replay
                    runs = [time_coldkv(backends[kern], tok, ids, resolve_table(name, n_layers), a.new)
                            for _ in range(1 + max(3, a.repeats))]
                    pre = float(np.median([r[0] for r in runs[1:]]))
                    dec = float(np.median([r[1] for r in runs[1:]]))
                    toks = runs[0][2]
                    first = toks if first is None else first
                    row = {"prompt_tokens": n, "kv_table": name, "new_tokens": a.new, "prefill_attention": kern,
                           "coldkv_decode_tok_s": round(dec, 1), "hf_decode_tok_s": round(hf_dec, 1),
                           "coldkv_prefill_tok_s": round(pre, 1), "hf_prefill_tok_s": round(hf_pre, 1),
                           "decode_ratio": round(dec / hf_dec, 3), "prefill_ratio": round(pre / hf_pre, 3),
                           "coldkv_prefill_tok_s_new_cache": round(runs[0][0], 1),
                           "coldkv_decode_tok_s_new_cache": round(runs[0][1], 1),
                           "coldkv_decode_tok_s_runs": [round(r[1], 1) for r in runs[1:]],
                           "tokens_equal_across_runs": all(r[2] == toks for r in runs),
                           "tokens_equal_first_kernel": toks == first, "model": model.name}
                    print(json.dumps(row), flush=True)
                    results.append(row)
            del backends
            write(a, torch, graph_ab, results)  # after each prompt: a cut-short run keeps its rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {a.out}")


def write(a, torch, graph_ab, results) -> None:
    out = {
        "command": "python " + " ".join(sys.argv),
        "device": torch.cuda.get_device_name(0),
        "commit": git_commit(a.commit),
        "versions": versions(),
        "decode_launch_overhead": graph_ab,
        "results": results,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")

if __name__ == "__main__":
    main()
