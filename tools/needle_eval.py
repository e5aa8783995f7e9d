#!/usr/bin/env python3
"""Needle-in-a-haystack accuracy of an HF checkpoint with HF transformers (bf16 KV), greedy.

    PYTHONUNBUFFERED=1 python tools/needle_eval.py --model coldkv/models/coldkv-tiny \
        --haystack data/tok/heldout.npy --out bench/results/model_needle.json

Grid: context lengths x depths x samples, two tasks (tools/needle_data.py: ``passkey`` and RULER
``niah`` with one needle), fixed seed. The haystack is the held-out split of the corpus (never
trained on), wrapped around when a context is longer than it. A sample is correct when the greedy
continuation contains the 7-digit value (RULER's substring match; the first 7 digits generated are
the value in practice). Lengths can also be run with YaRN rope scaling
(factor = ceil(length / original), original = the config's max_position_embeddings).
--plan orders the runs; with --time-limit the ones not started in time are skipped (and listed).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from needle_data import NeedleMaker  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoConfig, Qwen3ForCausalLM  # noqa: E402


def parse_len(s: str) -> int:
    s = s.strip().lower()
    return int(float(s[:-1]) * 1024) if s.endswith("k") else int(s)


def load(model_dir: str, device, yarn_factor: float | None):
    cfg = AutoConfig.from_pretrained(model_dir)
    orig = cfg.max_position_embeddings
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", 1e6))
    if yarn_factor:
        rp = {"rope_type": "yarn", "factor": float(yarn_factor), "original_max_position_embeddings": orig,
              "rope_theta": theta}
        if hasattr(cfg, "rope_parameters"):
            cfg.rope_parameters = rp
        cfg.rope_scaling = dict(rp)
        cfg.max_position_embeddings = int(orig * yarn_factor)
    m = Qwen3ForCausalLM.from_pretrained(model_dir, config=cfg, dtype=torch.bfloat16).to(device).eval()
    return m, orig


@torch.no_grad()
def greedy(model, ids: torch.Tensor, new: int) -> torch.Tensor:
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    past = out.past_key_values
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    toks = [nxt]
    for _ in range(new - 1):
        out = model(input_ids=nxt, past_key_values=past, use_cache=True)
        past = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        toks.append(nxt)
    return torch.cat(toks, 1)


def run_grid(model, tok, maker, lengths, depths, samples, tasks, device, label, max_batch_tokens, log):
    rows = []
    for L in lengths:
        for task in tasks:
            items = []
            for d in depths:
                n = samples if L <= 131072 else max(1, samples // 2)
                for s in range(n):
                    ids, _, meta, plen, ans = maker.make(L, task, depths=[d], n_needles=1, n_queries=1)
                    items.append((d, s, ids[:plen], ans))
            plen_set = {len(it[2]) for it in items}
            t0 = time.time()
            correct = 0
            # prompts differ in length by a few tokens (key words); batch equal lengths
            by_len = {}
            for it in items:
                by_len.setdefault(len(it[2]), []).append(it)
            for plen, group in by_len.items():
                bs = max(1, max_batch_tokens // plen)
                for i in range(0, len(group), bs):
                    g = group[i:i + bs]
                    x = torch.from_numpy(np.stack([it[2] for it in g])).to(device)
                    gen = greedy(model, x, 10).cpu().numpy()
                    for it, row in zip(g, gen):
                        text = tok.decode(row.tolist())
                        ok = it[3] in text
                        correct += ok
                        rows.append({"setting": label, "task": task, "length": L, "prompt_tokens": plen,
                                     "depth": it[0], "sample": it[1], "answer": it[3],
                                     "output": text, "correct": bool(ok)})
            acc = correct / len(items)
            log(f"{label:>10} {task:>8} {L:>7}: {correct}/{len(items)} = {acc:.3f} "
                f"({time.time() - t0:.1f}s, prompt lengths {sorted(plen_set)[:3]}...)")
    return rows


def summarize(rows):
    out = {}
    for r in rows:
        k = (r["setting"], r["task"], r["length"])
        c = out.setdefault(k, [0, 0])
        c[0] += r["correct"]
        c[1] += 1
    return [{"setting": s, "task": t, "length": L, "correct": c, "n": n, "accuracy": c / n}
            for (s, t, L), (c, n) in sorted(out.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2]))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="coldkv/models/coldkv-tiny")
    ap.add_argument("--haystack", default="data/tok/heldout.npy")
    ap.add_argument("--plan", default="plain:4k,plain:8k,plain:16k,plain:32k,plain:64k,plain:128k,"
                    "yarn:128k,yarn:360k,plain:360k",
                    help="ordered setting:length list; yarn factor = ceil(length / original)")
    ap.add_argument("--depths", default="0,0.25,0.5,0.75,1.0")
    ap.add_argument("--samples", type=int, default=4, help="per (length, depth, task); halved above 128k")
    ap.add_argument("--tasks", default="passkey,niah")
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--max-batch-tokens", type=int, default=262144)
    ap.add_argument("--time-limit", type=float, default=0, help="seconds; skip the rest after this")
    ap.add_argument("--out", default="bench/results/model_needle.json")
    args = ap.parse_args()

    t_start = time.time()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    hay = np.load(args.haystack)
    depths = [float(d) for d in args.depths.split(",")]
    tasks = args.tasks.split(",")
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    def over():
        return args.time_limit and time.time() - t_start > args.time_limit

    rows = []
    model, orig = load(args.model, device, None)
    cur = None  # current yarn factor
    for spec in args.plan.split(","):
        kind, L = spec.split(":")
        L = parse_len(L)
        if over():
            log(f"time limit: skipped {spec}")
            continue
        f = None if kind == "plain" else max(1.0, float(math.ceil(L / orig)))
        if f != cur:
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
            model, _ = load(args.model, device, f)
            cur = f
        maker = NeedleMaker(tok, hay, np.random.default_rng([args.seed, L]))
        rows += run_grid(model, tok, maker, [L], depths, args.samples, tasks, device,
                         "plain" if f is None else f"yarn{f:g}", args.max_batch_tokens, log)
    import tokenizers
    import transformers
    res = {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "python": platform.python_version()},
        "model": args.model, "kv": "bf16 (HF DynamicCache)", "decoding": "greedy, 10 new tokens",
        "match": "7-digit value is a substring of the continuation",
        "haystack": args.haystack + " (held-out split, wrapped)", "seed": args.seed,
        "depths": depths, "samples_per_cell": args.samples, "tasks": tasks,
        "original_max_position_embeddings": orig,
        "summary": summarize(rows), "log": lines, "seconds": round(time.time() - t_start, 1), "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    for s in res["summary"]:
        log(f"{s['setting']:>8} {s['task']:>8} {s['length']:>7} {s['correct']:>3}/{s['n']:<3} {s['accuracy']:.3f}")


if __name__ == "__main__":
    main()
