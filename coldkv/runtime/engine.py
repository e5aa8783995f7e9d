"""The generate loop: chunked prefill, decode, sampling, stop conditions, streaming, stats.

Backend-agnostic: a backend turns token ids into float32 logits and owns its KV cache.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coldkv.errors import PlanError
from coldkv.runtime.backend import Backend
from coldkv.runtime.kv_table import KVTable
from coldkv.runtime.sampling import Sampler, SamplingParams
from coldkv.runtime.tokenizer import StreamingText, Tokenizer

@dataclass
class GenerateResult:
    text: str
    tokens: list[int]  # generated ids (a stop string's tokens included; eos not)
    prompt_tokens: int
    finish_reason: str  # "eos" | "stop" | "length" (max_new_tokens) | "context" (the model's context is full)
    prefill_s: float
    decode_s: float
    decode_steps: int  # forward passes of one token
    kv_bytes: int  # bytes of the pages the sequence holds at the end
    kv_reserved_bytes: int  # bytes of all pool pages (free ones included)
    kv_bytes_per_token: float
    kv_table: KVTable
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": len(self.tokens),
            "finish_reason": self.finish_reason,
            "prefill_s": round(self.prefill_s, 4),
            "decode_s": round(self.decode_s, 4),
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 2),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
            "kv_bytes": self.kv_bytes,
            "kv_reserved_bytes": self.kv_reserved_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_table": self.kv_table.name,
            "kv_table_layers": self.kv_table.to_json()["layers"],
            "device": self.device,
            **self.extra,
        }


def plan_tokens(backend: Backend, prompt_len: int, max_new_tokens: int, table: KVTable) -> int:
    """Tokens the cache must hold; raises PlanError if the prompt does not fit the model or memory."""
    ctx = backend.args.max_position_embeddings
    if prompt_len == 0:
        raise PlanError("the prompt is empty (0 tokens)")
    if prompt_len >= ctx:
        raise PlanError(f"the prompt has {prompt_len} tokens; the model's context is {ctx} tokens")
    max_tokens = min(prompt_len + max_new_tokens, ctx)
    backend.check_memory(table, max_tokens)
    return max_tokens


def generate(
    backend: Backend,
    tokenizer: Tokenizer,
    prompt_ids: list[int] | np.ndarray,
    *,
    table: KVTable,
    max_new_tokens: int = 256,
    sampling: SamplingParams = SamplingParams(),
    stop: tuple[str, ...] = (),
    prefill_chunk: int | None = None,
    on_text: Callable[[str], None] | None = None,
    on_prefill: Callable[[int, int], None] | None = None,
) -> GenerateResult:
    """Generate after `prompt_ids`. on_text gets each printable piece; on_prefill(done, total) after each
    chunk. prefill_chunk: prompt tokens per step (default: the backend's)."""
    # the ids become an array before the prefill timer starts, as HF's prefill is timed from a tensor
    # (32768 ids from a list: ~0.7 ms on the device's host, ~2.5% of the bundled model's prefill there)
    prompt = np.asarray(prompt_ids, np.int64)
    max_tokens = plan_tokens(backend, len(prompt), max_new_tokens, table)
    cache = backend.new_cache(table, max_tokens)
    eos = set(backend.args.eos_token_ids)
    sampler = Sampler(sampling)
    stream = StreamingText(tokenizer, stop)
    emit = on_text or (lambda s: None)

    t0 = time.perf_counter()
    logits = backend.prefill(prompt, cache, prefill_chunk or backend.prefill_chunk,
                             on_progress=(lambda done: on_prefill(done, len(prompt))) if on_prefill else None)
    prefill_s = time.perf_counter() - t0

    tokens: list[int] = []
    budget = max_tokens - len(prompt)  # max_new_tokens, or less where the context ends first
    finish = "length" if budget == max_new_tokens else "context"
    steps, t_decode = 0, None
    token = sampler(logits)  # the prompt's logits come to the host; later draws are the backend's
    decoder = None  # the backend's decode steps, started once the first token is known to be kept
    try:
        while len(tokens) < budget:
            if token in eos:
                finish = "eos"
                break
            tokens.append(token)
            emit(stream.add(token))
            if stream.stopped:
                finish = "stop"
                break
            if len(tokens) == budget:
                break
            if decoder is None:
                t_decode = time.perf_counter()
                decoder = backend.decode_steps(token, cache, sampler, budget - len(tokens))
            token = next(decoder)
            steps += 1
    finally:
        if decoder is not None:
            decoder.close()  # a step run ahead that was not read leaves the cache here
    # wall time from the first decode step to the last token's use: the host's streaming and stop
    # checks count, as they do for a user (and a backend that overlaps them with the GPU gains)
    decode_s = time.perf_counter() - t_decode if t_decode is not None else 0.0
    emit(stream.flush())
    return GenerateResult(
        text=stream.text, tokens=tokens, prompt_tokens=len(prompt), finish_reason=finish,
        prefill_s=prefill_s, decode_s=decode_s, decode_steps=steps, kv_bytes=cache.nbytes,
        kv_reserved_bytes=cache.reserved_nbytes, kv_bytes_per_token=cache.bytes_per_token(),
        kv_table=table, device=backend.name,
    )
