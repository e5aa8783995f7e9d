#!/usr/bin/env python3
"""Train the byte-level BPE tokenizer of the bundled model and tokenize the corpus.

    python tools/train_tokenizer.py --corpus data/corpus --out data/tok --vocab 8192

Writes data/tok/tokenizer.json (HF `tokenizers` format; loads with `Tokenizer.from_file` and with
transformers' PreTrainedTokenizerFast), data/tok/train.npy and data/tok/heldout.npy (uint16 token
ids, documents separated by <|endoftext|>), and data/tok/stats.json (tokens, bytes per token).

Digits are split one per token (as Qwen and Llama 3 do), so a 7-digit needle value is 7 tokens and
retrieval is a copy of single digits. Special tokens: <|endoftext|> (id 0: eos, document
separator, pad) and <|pad|>.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|pad|>"]


def iter_texts(path: Path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def build(vocab: int, corpus: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(iter_texts(corpus / "train.jsonl"), trainer=trainer)
    return tok


def encode_file(tok: Tokenizer, path: Path, eos: int) -> tuple[np.ndarray, int]:
    texts = list(iter_texts(path))
    ids: list[int] = []
    nbytes = 0
    for enc, t in zip(tok.encode_batch(texts), texts):
        ids.extend(enc.ids)
        ids.append(eos)
        nbytes += len(t.encode("utf-8"))
    return np.asarray(ids, dtype=np.uint16), nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="data/corpus")
    ap.add_argument("--out", default="data/tok")
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()
    corpus, out = Path(args.corpus), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build(args.vocab, corpus)
    tok.save(str(out / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    assert eos == 0 and tok.get_vocab_size() <= 65535
    stats = {"vocab_size": tok.get_vocab_size(), "eos_id": eos}
    for split in ("train", "heldout"):
        arr, nbytes = encode_file(tok, corpus / f"{split}.jsonl", eos)
        np.save(out / f"{split}.npy", arr)
        stats[split] = {"tokens": int(arr.size), "bytes": nbytes, "bytes_per_token": nbytes / arr.size}
        print(split, stats[split], flush=True)
    (out / "stats.json").write_text(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
