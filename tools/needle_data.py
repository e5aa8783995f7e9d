"""Needle / passkey documents at the token level, shared by tools/train_model.py and tools/needle_eval.py.

Completion style (a small model cannot follow instructions). Two tasks:

* ``passkey`` (landmark-attention paper): a haystack with one line
  "The pass key is 4829173. Remember it. 4829173 is the pass key." and, at the end,
  "What is the pass key? The pass key is" -> " 4829173".
* ``niah`` (RULER niah_single with word keys): one or more lines
  "One of the special magic numbers for {key} is: {7 digits}." and, at the end,
  "What is the special magic number for {key} mentioned in the provided text?
  The special magic number for {key} mentioned in the provided text is" -> " {7 digits}".

Needles are inserted at line boundaries (after a token that ends with a newline) of a haystack
taken from the corpus token stream, so a whole prompt has an exact token length; values are
7-digit numbers (RULER), one token per digit with our tokenizer.
"""
from __future__ import annotations

import numpy as np

# Keys for the niah task: common, unambiguous English words (two per key, RULER uses word keys).
KEY_WORDS = (
    "apple river stone cloud tiger garden silver window candle forest ocean mirror rocket violin "
    "pencil island thunder marble lemon falcon desert copper meadow harbor lantern velvet cactus "
    "glacier comet anchor bamboo canyon cherry dolphin ember feather galaxy hammer ivory jasmine "
    "kettle ladder magnet nectar orchid pepper quartz raven saddle tulip umbrella valley walnut "
    "yellow zebra basket button carpet dragon engine fossil ginger honey igloo jungle koala "
    "lizard mango needle olive parrot puzzle quilt rabbit salmon tomato unicorn vessel wizard "
    "bridge castle circle crystal feast flame frost harvest helmet journey kingdom legend "
    "morning noodle oyster palace pirate planet pocket prism shadow spider summer sunset "
    "temple ticket tunnel turtle voyage wagon whisper winter banana coffee dinner elbow"
).split()


def ends_with_newline_ids(tok) -> np.ndarray:
    """Boolean table over the vocabulary: does the token's text end with a newline?"""
    v = tok.get_vocab_size()
    out = np.zeros(v, dtype=bool)
    for i in range(v):
        s = tok.decode([i], skip_special_tokens=False)
        out[i] = s.endswith("\n")
    return out


class NeedleMaker:
    def __init__(self, tok, haystack: np.ndarray, rng: np.random.Generator):
        self.tok = tok
        self.hay = haystack
        self.rng = rng
        self.nl = ends_with_newline_ids(tok)
        self.eos = tok.token_to_id("<|endoftext|>")
        self._nl_id = tok.encode("\n").ids[-1]

    def enc(self, s: str) -> list[int]:
        return self.tok.encode(s).ids

    def value(self) -> str:
        return str(int(self.rng.integers(1_000_000, 10_000_000)))

    def key(self) -> str:
        a, b = self.rng.choice(len(KEY_WORDS), 2, replace=False)
        return f"{KEY_WORDS[a]}-{KEY_WORDS[b]}"

    def _haystack(self, n: int) -> np.ndarray:
        """n haystack tokens from a random place in the corpus (wrapping around), eos -> newline,
        so a prompt is one long text and ends with a newline token."""
        start = int(self.rng.integers(0, len(self.hay)))
        idx = (start + np.arange(n)) % len(self.hay)
        h = self.hay[idx].astype(np.int64)
        h[h == self.eos] = self._nl_id
        if n:
            h[-1] = self._nl_id
        return h

    def _insert(self, hay: np.ndarray, needles: list[list[int]], depths: list[float]) -> np.ndarray:
        """Insert each needle after the line boundary nearest to its depth (fraction of the haystack)."""
        bounds = np.flatnonzero(self.nl[hay]) + 1  # insertion points right after a newline token
        bounds = np.concatenate([[0], bounds[bounds < len(hay)]])
        cuts = []
        for d in depths:
            p = int(round(d * len(hay)))
            j = int(np.searchsorted(bounds, p))
            cands = [bounds[k] for k in (j - 1, j) if 0 <= k < len(bounds)]
            cuts.append(min(cands, key=lambda b: abs(b - p)))
        order = np.argsort(cuts, kind="stable")
        pieces, prev = [], 0
        for o in order:
            pieces.append(hay[prev:cuts[o]])
            pieces.append(np.asarray(needles[o], dtype=np.int64))
            prev = cuts[o]
        pieces.append(hay[prev:])
        return np.concatenate(pieces)

    def make(self, length: int, task: str, depths: list[float] | None = None, n_needles: int = 1,
             n_queries: int = 1):
        """One document of exactly `length` tokens.

        Returns (ids int64[length], answer_mask bool[length] marking the answer tokens as targets,
        i.e. positions whose *label* is an answer token, and a list of (key, value, depth) needles;
        `prompt_len` = index where the first answer starts).
        """
        rng = self.rng
        needles, meta, queries = [], [], []
        if task == "passkey":
            v = self.value()
            needles.append(self.enc(f"The pass key is {v}. Remember it. {v} is the pass key.\n"))
            meta.append(("pass key", v))
            queries.append((self.enc("What is the pass key? The pass key is"), self.enc(f" {v}."), v))
        elif task == "niah":
            keys = set()
            while len(keys) < n_needles:
                keys.add(self.key())
            keys = list(keys)
            vals = [self.value() for _ in keys]
            for k, v in zip(keys, vals):
                needles.append(self.enc(f"One of the special magic numbers for {k} is: {v}.\n"))
                meta.append((k, v))
            for qi in rng.choice(len(keys), min(n_queries, len(keys)), replace=False):
                k, v = keys[qi], vals[qi]
                q = (f"What is the special magic number for {k} mentioned in the provided text? "
                     f"The special magic number for {k} mentioned in the provided text is")
                queries.append((self.enc(q), self.enc(f" {v}."), v))
        else:
            raise ValueError(task)
        if depths is None:
            depths = list(rng.uniform(0.0, 1.0, len(needles)))
        tail, amask_tail = [], []
        for qi, (q, a, _) in enumerate(queries):
            sep = [self._nl_id] if qi else []
            tail += sep + q + a
            amask_tail += [False] * (len(sep) + len(q)) + [True] * len(a)
        n_hay = length - sum(len(n) for n in needles) - len(tail)
        if n_hay < 16:
            raise ValueError(f"length {length} too short for the needles")
        ids = np.concatenate([self._insert(self._haystack(n_hay), needles, depths),
                              np.asarray(tail, dtype=np.int64)])
        amask = np.zeros(length, dtype=bool)
        amask[length - len(tail):] = amask_tail
        assert ids.shape == (length,)
        prompt_len = length - len(tail) + len(queries[0][0])
        return ids, amask, [(k, v, d) for (k, v), d in zip(meta, depths)], prompt_len, queries[0][2]
