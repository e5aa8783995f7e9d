"""tokenizer.json through HF `tokenizers`, and a streaming detokenizer that holds back stop strings."""
from __future__ import annotations

from pathlib import Path

from coldkv.errors import ModelLoadError


class Tokenizer:
    def __init__(self, path: Path):
        from tokenizers import Tokenizer as HFTokenizer

        if not path.exists():
            raise ModelLoadError(f"{path} is missing (coldkv needs the checkpoint's tokenizer.json)")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise ModelLoadError(f"{path} is not a valid tokenizer.json ({str(exc).splitlines()[0]})") from None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "Tokenizer":
        return cls(Path(model_dir) / "tokenizer.json")

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids as transformers' tokenizer gives them (special tokens such as Llama's BOS included)."""
        return self._tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


class StreamingText:
    """Turns a growing list of token ids into text pieces safe to print.

    Holds back (1) an incomplete UTF-8 sequence at the end (decoded as U+FFFD) and (2) a tail that
    could be the start of a stop string; stops at the first stop string, which is not printed.
    """

    def __init__(self, tokenizer: Tokenizer, stop: list[str] | tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""  # final text so far (up to a stop string once one is found)
        self.emitted = 0  # characters of `text` already handed out
        self.stopped = False
        # decode(ids[:read]) is `done`; ids[prefix:read] are decoded again as the context of the
        # ids after them (a SentencePiece decoder drops the first token's leading space)
        self._done, self._prefix, self._read = "", 0, 0

    def add(self, token: int) -> str:
        """Append a token; return the newly printable text ('' if nothing yet)."""
        self.ids.append(token)
        text = self._decoded()
        for s in self.stop:
            at = text.find(s, max(0, self.emitted - len(s)))
            if at >= 0:
                text = text[:at]
                self.stopped = True
        self.text = text
        if self.stopped:
            return self._emit(len(text))
        safe = len(text)
        if text.endswith("\ufffd"):
            safe = len(text.rstrip("\ufffd"))
        hold = 0
        for s in self.stop:  # hold back the longest tail that could start a stop string
            for k in range(min(len(s) - 1, safe), 0, -1):
                if text.endswith(s[:k], 0, safe):
                    hold = max(hold, k)
                    break
        safe -= hold
        return self._emit(safe)

    def _decoded(self) -> str:
        """decode(self.ids), decoding only the ids since the last point where the text was whole
        (no partial UTF-8 at its end), with the ones before that point as context: decoding all ids
        every token made a long generation quadratic (0.6 ms a token after 4096 tokens on the
        bundled model's tokenizer, two decode steps of its GPU time)."""
        ids, dec = self.ids, self.tokenizer.decode
        head, new = dec(ids[self._prefix:self._read]), dec(ids[self._prefix:])
        if not new.startswith(head):
            # not local here (a byte-fallback decoder decodes adjacent byte-token characters as
            # one run, so an incomplete one changes the one before): decode all ids
            return dec(ids)
        text = self._done + new[len(head):]
        if not text.endswith("\ufffd"):
            self._done, self._prefix, self._read = text, self._read, len(ids)
        return text

    def flush(self) -> str:
        """The held-back rest, at the end of generation."""
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        if upto <= self.emitted:
            return ""
        piece = self.text[self.emitted:upto]
        self.emitted = upto
        return piece
