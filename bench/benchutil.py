"""Shared by the benchmark drivers (run as `python bench/X.py`, so this imports as `benchutil`)."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_commit(arg: str | None = None) -> str:
    """The commit to record: --commit if given (the device copy has no .git), else HEAD."""
    if arg:
        return arg
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def prompt_ids(tok, n: int) -> list[int]:
    """n token ids: the examples' texts, tokenized and repeated to the length."""
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "examples").glob("*.txt")))
    ids = tok.encode(text)
    return (ids * (n // len(ids) + 1))[:n]
