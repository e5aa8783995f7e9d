"""KV tables: which hot format holds K and V in each layer.

`--kv-table` takes a name or a JSON file (format in docs/runtime.md):

    {"default": "nvfp4",
     "layers": {"0": "int8", "1-3": {"k": "nvfp4", "v": "iso3"}, "-1": "bf16"}}

A string entry is a named table's per-layer pair ("bf16", "int8", "nvfp4" = K nvfp4 + V iso3), or
any other hot format name for both K and V ("iso3"); an object names K and V separately.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coldkv.errors import KVTableError

HOT_FORMATS = ("bf16", "int8", "nvfp4", "iso3")
# Named tables: the (K, V) pair used on every layer. The seed stores 4-bit layers as K nvfp4 + V iso3.
NAMED = {"bf16": ("bf16", "bf16"), "int8": ("int8", "int8"), "nvfp4": ("nvfp4", "iso3")}
TABLE_NAMES = (*NAMED, "default")
# A checkpoint may ship its own measured table (written by `coldkv analyze-kv`); `default` uses it.
MODEL_TABLE_FILE = "kv_table.json"


@dataclass(frozen=True)
class KVTable:
    name: str  # what the user asked for: a table name or the file path
    layers: tuple[tuple[str, str], ...]  # (K format, V format) per layer

    def __post_init__(self) -> None:
        for k, v in self.layers:
            for f in (k, v):
                if f not in HOT_FORMATS:
                    raise KVTableError(f"KV table {self.name}: unknown format {f!r}; use one of {', '.join(HOT_FORMATS)}")

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def summary(self) -> str:
        """Compact text: 'K nvfp4 / V iso3 x26, int8 x2 (layers 0, 27)'."""
        groups: dict[tuple[str, str], list[int]] = {}
        for i, kv in enumerate(self.layers):
            groups.setdefault(kv, []).append(i)
        parts = []
        for (k, v), idx in sorted(groups.items(), key=lambda g: -len(g[1])):
            pair = k if k == v else f"K {k} / V {v}"
            where = "" if len(groups) == 1 else f" (layers {_ranges(idx)})"
            parts.append(f"{pair} x{len(idx)}{where}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"layers": [{"k": k, "v": v} for k, v in self.layers]}


def _ranges(idx: list[int]) -> str:
    out, start = [], idx[0]
    for a, b in zip(idx, idx[1:] + [None]):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def _pair(entry: Any, where: str) -> tuple[str, str]:
    if isinstance(entry, str):
        if entry in NAMED:
            return NAMED[entry]
        if entry in HOT_FORMATS:
            return entry, entry
        raise KVTableError(f"{where}: unknown format {entry!r}; use one of {', '.join(HOT_FORMATS)}")
    if isinstance(entry, dict) and set(entry) <= {"k", "v"} and len(entry) == 2:
        return _pair_fmt(entry["k"], where), _pair_fmt(entry["v"], where)
    raise KVTableError(f"{where}: expected a format name or {{\"k\": FORMAT, \"v\": FORMAT}}, got {entry!r}")


def _pair_fmt(f: Any, where: str) -> str:
    if f not in HOT_FORMATS:
        raise KVTableError(f"{where}: unknown format {f!r}; use one of {', '.join(HOT_FORMATS)}")
    return f


def default_table(n_layers: int) -> tuple[tuple[str, str], ...]:
    """Without a measured table: int8 on the first and last layer (the usual sensitive ones), K nvfp4 +
    V iso3 elsewhere. `coldkv analyze-kv` measures a better one per model."""
    return tuple(NAMED["int8"] if i in (0, n_layers - 1) else NAMED["nvfp4"] for i in range(n_layers))


def parse_table(data: Any, n_layers: int, name: str) -> KVTable:
    """A table from the JSON file's content."""
    if not isinstance(data, dict) or "layers" not in data and "default" not in data:
        raise KVTableError(f"KV table {name}: expected a JSON object with 'layers' and/or 'default'")
    fallback = _pair(data["default"], f"KV table {name}, default") if "default" in data else None
    layers: list[tuple[str, str] | None] = [fallback] * n_layers
    spec = data.get("layers", {})
    if isinstance(spec, list):
        if len(spec) != n_layers:
            raise KVTableError(f"KV table {name} lists {len(spec)} layers; the model has {n_layers}")
        layers = [_pair(e, f"KV table {name}, layer {i}") for i, e in enumerate(spec)]
    elif isinstance(spec, dict):
        for key, entry in spec.items():
            for i in _layer_keys(str(key), n_layers, name):
                layers[i] = _pair(entry, f"KV table {name}, layer {i}")
    else:
        raise KVTableError(f"KV table {name}: 'layers' must be a list or an object")
    missing = [i for i, p in enumerate(layers) if p is None]
    if missing:
        raise KVTableError(f"KV table {name} gives no format for layers {_ranges(missing)} and has no 'default'")
    return KVTable(name, tuple(layers))  # type: ignore[arg-type]


def _layer_keys(key: str, n_layers: int, name: str) -> range:
    """'3' -> [3], '-1' -> the last layer, '2-5' -> 2..5 inclusive."""
    try:
        if key.lstrip("-").isdigit():
            i = int(key)
            i = i + n_layers if i < 0 else i
            lo, hi = i, i
        else:
            a, b = key.split("-")
            lo, hi = int(a), int(b)
    except ValueError:
        raise KVTableError(f"KV table {name}: bad layer key {key!r}; use '3', '-1' or '2-5'") from None
    if not (0 <= lo <= hi < n_layers):
        raise KVTableError(f"KV table {name}: layer key {key!r} is outside the model's {n_layers} layers")
    return range(lo, hi + 1)


def resolve_table(spec: str, n_layers: int, model_dir: Path | None = None) -> KVTable:
    """A KVTable from a `--kv-table` value: a table name or a JSON file path."""
    if spec in NAMED:
        return KVTable(spec, (NAMED[spec],) * n_layers)
    if spec == "default":
        shipped = model_dir / MODEL_TABLE_FILE if model_dir is not None else None
        if shipped is not None and shipped.exists():
            return load_table_file(shipped, n_layers, name="default")
        return KVTable("default", default_table(n_layers))
    path = Path(spec).expanduser()
    if path.suffix == ".json" or path.exists():
        return load_table_file(path, n_layers)
    raise KVTableError(f"unknown KV table {spec!r}; use {', '.join(TABLE_NAMES)} or a JSON file")


def load_table_file(path: Path, n_layers: int, name: str | None = None) -> KVTable:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise KVTableError(f"KV table file {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise KVTableError(f"KV table file {path} is not valid JSON ({exc})") from None
    return parse_table(data, n_layers, name or str(path))
