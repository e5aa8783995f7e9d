"""The `coldkv` command: thin Typer commands handing off to keyword-only functions.

Domain errors (coldkv.errors.ColdkvError) become one line on stderr and exit code 2 here, and
nowhere else.
"""
from __future__ import annotations

from typing import Annotated

import typer

from coldkv import __version__

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
