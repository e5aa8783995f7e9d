"""What `coldkv generate` and `coldkv info` do (cli.py only parses options and maps errors)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from coldkv.errors import InputError
from coldkv.cuda_probe import cuda_present
from coldkv.numba_kernels.jit_cache import cache_usage, compile_notices
from coldkv.runtime.backend import cpu_summary, gpu_summary, load_backend
from coldkv.runtime.blas import blas_threads, get_threads
from coldkv.runtime.engine import generate
from coldkv.runtime.kv_cache import kv_bytes_per_token
from coldkv.runtime.kv_table import NAMED, resolve_table
from coldkv.runtime.loader import load_args, resolve_model
from coldkv.runtime.safetensors_io import open_checkpoint
from coldkv.runtime.sampling import SamplingParams
from coldkv.runtime.tokenizer import Tokenizer


def read_prompt(prompt_file: str) -> str:
    if prompt_file == "-":
        data = sys.stdin.buffer.read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError("the prompt on stdin is not UTF-8 text") from None
    path = Path(prompt_file)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"prompt file {prompt_file} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"prompt file {prompt_file} is a directory") from None
    except UnicodeDecodeError:
        raise InputError(f"prompt file {prompt_file} is not UTF-8 text") from None
    except OSError as exc:
        raise InputError(f"cannot read prompt file {prompt_file}: {exc.strerror}") from None


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def generate_command(*, prompt_file: str, model: str | None, max_new_tokens: int, kv_table: str, device: str,
                     temperature: float, top_k: int, top_p: float, seed: int, stop: list[str], json_out: bool,
                     prefill_chunk: int | None = None, threads: int = 0) -> None:
    err = Console(stderr=True)
    prompt = read_prompt(prompt_file)  # read first: a bad prompt path should not wait for a model load
    model_dir = resolve_model(model)
    args = load_args(model_dir)
    table = resolve_table(kv_table, args.num_hidden_layers, model_dir)
    tokenizer = Tokenizer.from_dir(model_dir)
    backend, note = load_backend(model_dir, device, prefill_chunk=prefill_chunk)
    if note:
        err.print(f"note: {note}", highlight=False, soft_wrap=True)
    ids = tokenizer.encode(prompt)
    prefill_chunk = prefill_chunk or backend.prefill_chunk

    progress = None
    if len(ids) > prefill_chunk:
        progress = Progress(TextColumn("prefill"), BarColumn(), TextColumn("{task.completed}/{task.total} tokens"),
                            TimeRemainingColumn(), console=err, transient=True)
        task = progress.add_task("prefill", total=len(ids))
        progress.start()

    def on_prefill(done: int, total: int) -> None:
        if progress is not None:
            progress.update(task, completed=done)
            if done >= total:
                progress.stop()

    def on_text(piece: str) -> None:
        if piece:
            sys.stdout.write(piece)
            sys.stdout.flush()

    if threads and backend.name == "cpu" and get_threads() is None:
        err.print("note: --threads: numpy's BLAS is not an OpenBLAS coldkv can configure; ignored", highlight=False)
    compiling = False

    def on_compile(name: str) -> None:  # once: the first run on a machine waits for compiles
        nonlocal compiling
        if not compiling:
            compiling = True
            (progress.console if progress is not None else err).print(
                f"[dim]compiling {backend.name.upper()} kernels (the first run on this machine; later runs load "
                "them from the cache)[/dim]", highlight=False, soft_wrap=True)

    try:
        with blas_threads(threads if backend.name == "cpu" else None), compile_notices(on_compile):
            result = generate(backend, tokenizer, ids, table=table, max_new_tokens=max_new_tokens,
                              sampling=SamplingParams(temperature, top_k, top_p, seed), stop=tuple(stop),
                              prefill_chunk=prefill_chunk, on_text=None if json_out else on_text,
                              on_prefill=on_prefill)
    finally:
        if progress is not None:
            progress.stop()
    if json_out:
        out = {"model": str(model_dir), **result.to_json(), "compiled_kernels": compiling}
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        return
    sys.stdout.write("\n")
    err.print(
        f"[dim]{result.prompt_tokens} prompt tokens, {len(result.tokens)} generated ({result.finish_reason}); "
        f"prefill {result.prefill_tokens_per_s:.1f} tok/s, decode {result.decode_tokens_per_s:.1f} tok/s; "
        f"KV {_human(result.kv_bytes)} ({result.kv_bytes_per_token:.0f} B/token, table {table.name}: "
        f"{table.summary()}) on {result.device}"
        f"{'; this run compiled its kernels, and its rates count that time' if compiling else ''}[/dim]",
        highlight=False, soft_wrap=True,
    )


def info_command(*, model: str | None, json_out: bool) -> None:
    out = Console()
    cuda = cuda_present()
    device = {"cpu": cpu_summary(), "cuda": gpu_summary() if cuda else "not found"}
    model_dir = resolve_model(model)
    args = load_args(model_dir)
    files = open_checkpoint(model_dir)
    n_params = sum(int(_prod(f.tensors[n][1])) for n, f in files.items())
    dtypes = sorted({f.dtype(n) for n, f in files.items()})
    for f in set(files.values()):
        f.close()
    tables = {}
    for name in (*NAMED, "default"):
        t = resolve_table(name, args.num_hidden_layers, model_dir)
        tables[name] = {"bytes_per_token": kv_bytes_per_token(t, args.num_key_value_heads, args.head_dim),
                        "layers": t.summary()}
    rope = args.rope
    rope_text = f"{rope.rope_type}, theta {rope.theta:g}" + (f", factor {rope.factor:g}" if rope.rope_type != "default" else "")
    summary = {
        "path": str(model_dir), "architecture": args.architecture, "layers": args.num_hidden_layers,
        "hidden_size": args.hidden_size, "intermediate_size": args.intermediate_size,
        "attention_heads": args.num_attention_heads, "kv_heads": args.num_key_value_heads,
        "head_dim": args.head_dim, "vocab_size": args.vocab_size, "context": args.max_position_embeddings,
        "params": n_params, "weights_dtype": "/".join(dtypes), "tied_embeddings": args.tie_word_embeddings,
        "qk_norm": args.qk_norm, "qkv_bias": args.attention_bias, "rope": rope_text,
        "eos_token_ids": list(args.eos_token_ids),
    }
    cache = cache_usage()
    if json_out:
        sys.stdout.write(json.dumps({"device": device, "model": summary, "kv_tables": tables,
                                     "kernel_cache": cache}) + "\n")
        return
    out.print(f"[bold]device[/bold]  cpu: {device['cpu']}; cuda: {device['cuda']}", highlight=False, soft_wrap=True)
    out.print(f"[bold]kernels[/bold] compiled once, kept in {cache['path']} ({cache['files']} files, "
              f"{cache['bytes'] / 2**20:.1f} MiB; delete it to recompile)", highlight=False, soft_wrap=True)
    out.print(f"[bold]model[/bold]   {model_dir}", highlight=False, soft_wrap=True)
    out.print(
        f"        {args.architecture}, {n_params / 1e6:.1f}M params ({'/'.join(dtypes)}), {args.num_hidden_layers} layers, "
        f"hidden {args.hidden_size}, MLP {args.intermediate_size}, heads {args.num_attention_heads} q / "
        f"{args.num_key_value_heads} kv x {args.head_dim}, vocab {args.vocab_size}, context "
        f"{args.max_position_embeddings}, RoPE {rope_text}"
        f"{', q/k norm' if args.qk_norm else ''}{', qkv bias' if args.attention_bias else ''}"
        f"{', tied embeddings' if args.tie_word_embeddings else ''}, eos {list(args.eos_token_ids)}",
        highlight=False, soft_wrap=True,
    )
    t = Table(title="KV cache per token (pages of 64 tokens)", title_justify="left")
    t.add_column("--kv-table")
    t.add_column("bytes/token", justify="right")
    t.add_column("tokens/GiB", justify="right")
    t.add_column("vs bf16", justify="right")
    t.add_column("layers (K / V formats)")
    base = tables["bf16"]["bytes_per_token"]
    for name, row in tables.items():
        bpt = row["bytes_per_token"]
        t.add_row(name, f"{bpt:,.0f}", f"{2**30 / bpt:,.0f}", f"{base / bpt:.2f}x", row["layers"])
    out.print(t)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
