"""Backends: what the engine needs from a device. The CPU one is here; the CUDA one
(runtime/cuda_backend.py) plugs in the same seam.

A backend owns the weights in its memory and makes KV caches in its memory; the engine only sees
token ids in and float32 logits [vocab] out (host numpy), so sampling, stopping and streaming are
shared by every backend.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from coldkv.cuda_probe import cuda_present
from coldkv.errors import DeviceError, PlanError
from coldkv.runtime.config import ModelArgs
from coldkv.runtime.kv_cache import PagedKVCache, kv_bytes_per_token
from coldkv.runtime.kv_table import KVTable
from coldkv.runtime.sampling import Sampler

DEVICES = ("auto", "cpu", "cuda")


class KVCache(Protocol):
    table: KVTable
    length: int

    @property
    def nbytes(self) -> int: ...
    @property
    def reserved_nbytes(self) -> int: ...
    def bytes_per_token(self) -> float: ...
    def trim(self, n: int) -> None: ...


class Backend(Protocol):
    name: str  # "cpu" | "cuda"
    args: ModelArgs
    prefill_chunk: int  # default tokens per prefill step

    def new_cache(self, table: KVTable, max_tokens: int) -> KVCache: ...

    def forward(self, tokens: np.ndarray, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Run tokens [T] at the cache's next positions; -> float32 logits [vocab] (last) or [T, vocab]."""

    def prefill(self, tokens: np.ndarray, cache: KVCache, chunk: int,
                on_progress: Callable[[int], None] | None = None) -> np.ndarray:
        """A prompt in chunks of at most `chunk` tokens -> float32 logits [vocab] after its last token;
        on_progress(tokens done) as chunks finish."""

    def decode(self, token: int, cache: KVCache, sampler: Sampler) -> int:
        """Append one token; -> the next one, drawn by `sampler`'s rules."""

    def decode_steps(self, token: int, cache: KVCache, sampler: Sampler, max_steps: int) -> Iterator[int]:
        """decode() up to max_steps times from `token`, each step fed the last drawn token; yields
        the drawn tokens. When the caller stops early (closes the generator) the cache holds
        exactly the tokens it was given: `token` and every yielded one but the last."""

    def check_memory(self, table: KVTable, max_tokens: int) -> None:
        """Raise PlanError if a cache of max_tokens with this table cannot fit."""


def sequential_decode_steps(backend: Backend, token: int, cache: KVCache, sampler: Sampler,
                            max_steps: int) -> Iterator[int]:
    """Backend.decode_steps by decode() calls, one after the other."""
    for _ in range(max_steps):
        token = backend.decode(token, cache, sampler)
        yield token


def cublas_binding_installed() -> bool:
    """nvmath-python, through which the CUDA backend calls cuBLAS (runtime/gemm.py)."""
    return importlib.util.find_spec("nvmath") is not None


def select_device(device: str) -> tuple[str, str | None]:
    """-> (backend name, a note for stderr or None). auto: the GPU when it can be used."""
    if device not in DEVICES:
        raise DeviceError(f"unknown device {device!r}; use {', '.join(DEVICES)}")
    if device == "cpu":
        return "cpu", None
    present = cuda_present()
    if device == "cuda":
        if not present:
            raise DeviceError("--device cuda: no usable CUDA GPU and driver were found; use --device cpu")
        return "cuda", None
    if not present:
        return "cpu", None
    if not cublas_binding_installed():
        return "cpu", ("a CUDA GPU is present but nvmath-python (the cuBLAS binding) is not installed: "
                       "pip install 'coldkv[cuda]'; running on the CPU")
    return "cuda", None


def host_memory_available() -> int:
    """Bytes the kernel reports as available (MemAvailable), or physical memory if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_summary() -> str:
    name = "CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {len(os.sched_getaffinity(0))} cores, {host_memory_available() / 2**30:.1f} GiB available"


def gpu_summary() -> str:
    """The GPU the CUDA backend would use, its free memory, and whether nvmath-python (cuBLAS) is there."""
    from numba import cuda

    try:
        dev = cuda.get_current_device()
        free, total = cuda.current_context().get_memory_info()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        text = f"{name}, {free / 2**30:.1f} of {total / 2**30:.1f} GiB free"
    except Exception as exc:  # a driver that loads but cannot make a context
        return f"present but unusable ({exc})"
    if not cublas_binding_installed():
        text += "; nvmath-python not installed (pip install 'coldkv[cuda]'), so generate runs on the CPU"
    return text


class CPUBackend:
    name = "cpu"
    prefill_chunk = 512  # default tokens per prefill step

    def __init__(self, model_dir: Path, args: ModelArgs | None = None, page_tokens: int = 64):
        from coldkv.runtime.loader import load_args, load_weights
        from coldkv.runtime.model import Transformer

        self.args = args or load_args(model_dir)
        self.page_tokens = page_tokens
        self.model = Transformer(self.args, load_weights(model_dir, self.args))

    def new_cache(self, table: KVTable, max_tokens: int) -> PagedKVCache:
        a = self.args
        return PagedKVCache(table, a.num_key_value_heads, a.head_dim, max_tokens, self.page_tokens)

    def forward(self, tokens: np.ndarray, cache: PagedKVCache, all_logits: bool = False) -> np.ndarray:
        return self.model.forward(tokens, cache, all_logits)

    def prefill(self, tokens: np.ndarray, cache: PagedKVCache, chunk: int,
                on_progress: Callable[[int], None] | None = None) -> np.ndarray:
        logits = None
        for start in range(0, len(tokens), chunk):
            logits = self.forward(tokens[start:start + chunk], cache)
            if on_progress:
                on_progress(min(start + chunk, len(tokens)))
        return logits

    def decode(self, token: int, cache: PagedKVCache, sampler: Sampler) -> int:
        return sampler(self.forward(np.array([token]), cache))

    def decode_steps(self, token: int, cache: PagedKVCache, sampler: Sampler, max_steps: int) -> Iterator[int]:
        return sequential_decode_steps(self, token, cache, sampler, max_steps)

    def check_memory(self, table: KVTable, max_tokens: int) -> None:
        a = self.args
        pages = -(-max_tokens // self.page_tokens) * self.page_tokens
        # Pools grow by doubling, so up to 2x the pages can be held for a moment while copying.
        need = 2 * pages * kv_bytes_per_token(table, a.num_key_value_heads, a.head_dim, self.page_tokens)
        avail = host_memory_available()
        if need > avail:
            raise PlanError(
                f"{max_tokens} tokens of KV with table {table.name} need {need / 2**30:.2f} GiB "
                f"> {avail / 2**30:.2f} GiB available; try a smaller --kv-table (nvfp4), a shorter "
                "prompt or fewer --max-new-tokens"
            )


def load_backend(model_dir: Path, device: str = "auto", page_tokens: int = 64,
                 prefill_chunk: int | None = None) -> tuple[Backend, str | None]:
    """-> (backend with the model loaded, a note for stderr or None). prefill_chunk: the tokens of
    a prefill step the caller will ask for; the CUDA backend sizes its pass buffers for it (rounded
    up to its PAD_QUANTUM) instead of its default, so a longer step is not cut to the default."""
    name, note = select_device(device)
    if name == "cuda":
        from numba.cuda.cudadrv.driver import CudaAPIError

        from coldkv.runtime.cuda_backend import CUDABackend, cache_tokens

        rows = None if prefill_chunk is None else cache_tokens(prefill_chunk)  # whole PAD_QUANTUMs
        try:
            return CUDABackend(model_dir, page_tokens=page_tokens, prefill_chunk=rows), note
        except CudaAPIError as exc:  # e.g. out of memory while uploading the weights
            raise DeviceError(f"CUDA: {exc}; use --device cpu") from None
    return CPUBackend(model_dir, page_tokens=page_tokens), note
