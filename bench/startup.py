"""Start-up: a one-off `coldkv generate --device cuda` in a fresh process, against HF transformers
doing the same in a fresh process (H200 + torch).

    python bench/startup.py --commit HASH      # writes bench/results/startup.json

Each run is a new Python process timed from spawn to exit, generating --new greedy tokens of a short
prompt with the bundled model (bf16 KV):
  coldkv_cold  `python -m coldkv generate --device cuda` with an empty kernel cache directory
               (NUMBA_CACHE_DIR): every kernel compiled, as on a machine's first run;
  coldkv_warm  the same command again, --repeats times: kernels loaded from that cache
               (numba_kernels/jit_cache.cuda_kernel);
  hf           import torch + transformers, from_pretrained (bf16, sdpa) to the GPU, generate.
Medians of the warm and HF runs; the tokens of the two tools are compared (greedy both).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchutil import git_commit, versions  # noqa: E402

import coldkv  # noqa: E402

_HF = """
import json, sys, torch, transformers
from coldkv.runtime.tokenizer import Tokenizer
model, text, new = sys.argv[1], open(sys.argv[2]).read(), int(sys.argv[3])
ids = Tokenizer.from_dir(model).encode(text)
hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
out = hf.generate(torch.tensor([ids], device="cuda"), max_new_tokens=new, do_sample=False)
print(json.dumps({"tokens": out[0, len(ids):].tolist()}))
"""


class ChildFailed(RuntimeError):
    """A timed process exited non-zero; the message holds the end of its stderr."""


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, dict]:
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode:  # the child's own error, not only its exit status
        raise ChildFailed(f"{cmd[:3]} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return time.perf_counter() - t, json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=coldkv.DEFAULT_MODEL)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "startup.json")
    a = ap.parse_args()
    import numpy as np
    import torch

    tmp = Path(tempfile.mkdtemp())
    prompt = tmp / "prompt.txt"
    prompt.write_text((ROOT / "examples" / "prompt.txt").read_text())
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp / "kernel_cache")}
    cmd = [sys.executable, "-m", "coldkv", "generate", str(prompt), "--model", str(a.model), "--device", "cuda",
           "--kv-table", "bf16", "-n", str(a.new), "--json"]
    cold, first = timed(cmd, env)
    warm = [timed(cmd, env) for _ in range(a.repeats)]
    warm_s = float(np.median([w[0] for w in warm]))
    row = {"new_tokens": a.new, "prompt_tokens": first["prompt_tokens"], "coldkv_cold_s": round(cold, 2),
           "coldkv_warm_s": round(warm_s, 2), "coldkv_warm_runs_s": [round(w[0], 2) for w in warm],
           "warm_vs_cold": round(cold / warm_s, 2),
           "tokens_equal_cold_warm": all(w[1]["tokens"] == first["tokens"] for w in warm),
           "kernel_cache_files": len(list((tmp / "kernel_cache").rglob("*.nbc")))}
    try:  # the peer: its failure is recorded, and coldkv's numbers are kept
        hf = [timed([sys.executable, "-c", _HF, str(a.model), str(prompt), str(a.new)]) for _ in range(a.repeats)]
        hf_s = float(np.median([h[0] for h in hf]))
        row.update(hf_s=round(hf_s, 2), hf_runs_s=[round(h[0], 2) for h in hf],
                   hf_vs_coldkv_warm=round(hf_s / warm_s, 2), tokens_equal_hf=hf[0][1]["tokens"] == first["tokens"])
    except ChildFailed as e:
        row["hf_error"] = str(e)[-2000:]
    print(json.dumps(row), flush=True)
    out = {
        "command": "python " + " ".join(sys.argv),
        "device": torch.cuda.get_device_name(0),
        "commit": git_commit(a.commit),
        "versions": versions(),
        "results": [row],
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    try:
        main()
    except ChildFailed as e:  # coldkv's own run failed: its error, no traceback of ours
        raise SystemExit(str(e)) from None
