"""The `coldkv` command: thin Typer commands handing off to keyword-only functions.

Domain errors (coldkv.errors.ColdkvError) become one line on stderr and exit code 2 here, and
nowhere else.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Optional

import typer

from coldkv import __version__
from coldkv.errors import ColdkvError

app = typer.Typer(
    name="coldkv",
    help="Long-context LLM inference on one GPU (or the CPU) with compressed, paged KV caches.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"coldkv {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Long-context LLM inference on one GPU (or the CPU) with compressed, paged KV caches."""


@contextmanager
def _domain_errors() -> Iterator[None]:
    """ColdkvError -> 'error: ...' on stderr, exit 2; Ctrl-C -> 130 and a closed stdout pipe -> 141,
    without a traceback."""
    try:
        yield
    except ColdkvError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo("\ninterrupted", err=True)
        raise typer.Exit(130) from None
    except BrokenPipeError:  # `coldkv generate ... | head`: the reader left; stop quietly like other tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(141) from None


ModelOpt = Annotated[
    Optional[str],
    typer.Option("--model", "-m", help="Checkpoint directory, or a model id in the local Hugging Face cache. "
                 "Default: the bundled model."),
]


@app.command()
def generate(
    prompt_file: Annotated[str, typer.Argument(help="Prompt text file ('-' reads stdin).")],
    model: ModelOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1, help="Most tokens to generate.")] = 256,
    kv_table: Annotated[str, typer.Option("--kv-table", help="KV formats per layer: bf16, int8, nvfp4 (K nvfp4 + "
                                          "V iso3), default, or a JSON table file (docs/runtime.md).")] = "default",
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda (auto: CUDA when present).")] = "auto",
    temperature: Annotated[float, typer.Option("--temperature", "-t", min=0.0, help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", min=0, help="Sample from the k most likely tokens (0 = off).")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="Nucleus sampling mass in (0, 1] "
                                         "(1 = off).")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed (same seed, same output).")] = 0,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop at this string (repeatable).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object (text, tokens, stats) instead "
                                           "of streaming.")] = False,
    prefill_chunk: Annotated[Optional[int], typer.Option(
        "--prefill-chunk", min=1, help="Prompt tokens per prefill step (default: 512 on the CPU; on CUDA 2048-32768 "
        "by model and GPU: the bundled model takes 32768 on an H100/H200, 4096-8192 on other GPUs). On CUDA a "
        "step's buffers grow with it (the bundled model: ~32 KB a token); the 4-bit KV scales are calibrated on "
        "the first step (on CUDA, its first 8192 tokens).")] = None,
    threads: Annotated[int, typer.Option("--threads", min=0, help="CPU backend: BLAS threads (0 = the BLAS "
                                         "default; 1 is often fastest on small or busy machines).")] = 0,
) -> None:
    """Run a model on a prompt file and stream the completion to stdout (stats on stderr)."""
    if top_p <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--top-p")
    from coldkv.runtime.commands import generate_command

    with _domain_errors():
        generate_command(prompt_file=prompt_file, model=model, max_new_tokens=max_new_tokens, kv_table=kv_table,
                         device=device, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                         stop=stop or [], json_out=json_out, prefill_chunk=prefill_chunk, threads=threads)


@app.command()
def info(
    model: ModelOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show the device, a model summary and the KV bytes per token of each table."""
    from coldkv.runtime.commands import info_command

    with _domain_errors():
        info_command(model=model, json_out=json_out)
