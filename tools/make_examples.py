#!/usr/bin/env python3
"""Write the example prompts (examples/*.txt) and, with transformers present, check them.

    python tools/make_examples.py --haystack data/tok/heldout.npy [--check]

Retrieval prompts are built like tools/needle_eval.py's (held-out haystack, needle at a line
boundary, completion-style question at the end) and decoded to text; the expected answer is
written next to each in examples/answers.json. --check runs HF transformers greedy (CPU is fine)
on every prompt and prints the continuation.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from needle_data import NeedleMaker  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

MODEL = Path(__file__).resolve().parent.parent / "coldkv" / "models" / "coldkv-tiny"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# (file, task, tokens, depth, seed)
RETRIEVAL = [
    ("prompt.txt", "passkey", 600, 0.4, 1),
    ("passkey_4k.txt", "passkey", 4096, 0.3, 2),
    ("niah_16k.txt", "niah", 16384, 0.6, 3),
]
# Plain completions in the style of the training text (a dictionary entry, a docs paragraph).
PLAIN = {
    "dictionary.txt": "Harbor \\Har\"bor\\, n.",
    "telescope.txt": "Telescope \\Tel\"e*scope\\, n.",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--haystack", default="data/tok/heldout.npy")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    hay = np.load(args.haystack)
    answers = {}
    for name, task, n, depth, seed in RETRIEVAL:
        maker = NeedleMaker(tok, hay, np.random.default_rng(seed))
        ids, _, meta, plen, ans = maker.make(n, task, depths=[depth])
        text = tok.decode(ids[:plen].tolist())
        (EXAMPLES / name).write_text(text, encoding="utf-8")
        answers[name] = {"task": task, "answer": ans, "depth": depth,
                         "prompt_tokens": len(tok.encode(text).ids)}
    for name, text in PLAIN.items():
        (EXAMPLES / name).write_text(text, encoding="utf-8")
    (EXAMPLES / "answers.json").write_text(json.dumps(answers, indent=2) + "\n")
    print(json.dumps(answers, indent=2))
    if args.check:
        import torch
        from transformers import Qwen3ForCausalLM
        m = Qwen3ForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
        for name in [r[0] for r in RETRIEVAL] + list(PLAIN):
            ids = torch.tensor([tok.encode((EXAMPLES / name).read_text(encoding="utf-8")).ids])
            with torch.no_grad():
                out = m.generate(ids, max_new_tokens=10 if name in answers else 48, do_sample=False)
            new = out[0, ids.shape[1]:].tolist()
            print(f"== {name} ({ids.shape[1]} tokens): {new}\n{tok.decode(new)!r}")


if __name__ == "__main__":
    main()
