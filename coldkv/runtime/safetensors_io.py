"""Read safetensors files into float32 numpy arrays, bf16 included.

numpy has no bfloat16, and `safetensors.numpy` refuses it, so we parse the (simple) format
ourselves: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
then the raw little-endian tensor bytes. Reading through a memory map keeps peak memory at the
float32 copy. Every offset is checked against the file size, so a truncated download is a clear
error, not a crash.
"""
from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np

from coldkv.errors import ModelLoadError

_DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bits; widened to float32 by a shift
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits -> float32 (exact: bf16 is the top half of a float32)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> uint16 bf16 bits, round to nearest even (finite values; checkpoints hold no NaN)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


class SafetensorsFile:
    """One .safetensors file: its tensor index, and float32 reads of single tensors."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self._f = open(self.path, "rb")
        except OSError as exc:
            raise ModelLoadError(f"cannot open {self.path}: {exc.strerror}") from None
        size = self.path.stat().st_size
        head = self._f.read(8)
        if len(head) < 8:
            raise ModelLoadError(f"{self.path} is not a safetensors file (truncated header)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100_000_000:
            raise ModelLoadError(f"{self.path} is truncated or not a safetensors file (header length {n})")
        try:
            header = json.loads(self._f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ModelLoadError(f"{self.path} has a malformed safetensors header") from None
        header.pop("__metadata__", None)
        self._data_start = 8 + n
        self.tensors: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            try:
                dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise ModelLoadError(f"{self.path}: malformed entry for tensor {name!r}") from None
            if dtype not in _DTYPES:
                raise ModelLoadError(f"{self.path}: tensor {name!r} has unsupported dtype {dtype}")
            if end - begin != _DTYPES[dtype].itemsize * int(np.prod(shape, dtype=np.int64)):
                raise ModelLoadError(f"{self.path}: tensor {name!r} size does not match its shape")
            if self._data_start + end > size:
                raise ModelLoadError(
                    f"{self.path} is truncated: tensor {name!r} ends at byte {self._data_start + end}, "
                    f"the file has {size}"
                )
            self.tensors[name] = (dtype, shape, begin, end)
        self._map = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ) if size > 0 else None

    def dtype(self, name: str) -> str:
        return self.tensors[name][0]

    def get_f32(self, name: str) -> np.ndarray:
        """The tensor as a new C-contiguous float32 array."""
        dtype, shape, begin, end = self.tensors[name]
        raw = np.frombuffer(self._map, dtype=_DTYPES[dtype], count=(end - begin) // _DTYPES[dtype].itemsize,
                            offset=self._data_start + begin).reshape(shape)
        if dtype == "BF16":
            return bf16_bits_to_f32(raw)
        return raw.astype(np.float32)

    def get_bf16(self, name: str) -> np.ndarray:
        """The tensor as uint16 bf16 bits: BF16 as stored, other float dtypes rounded (RNE)."""
        if self.dtype(name) == "BF16":
            return self._bits16(name)
        return f32_to_bf16_bits(self.get_f32(name))

    def _bits16(self, name: str) -> np.ndarray:
        """A 16-bit tensor's stored bits as a new uint16 array."""
        dtype, shape, begin, end = self.tensors[name]
        return np.frombuffer(self._map, dtype="<u2", count=(end - begin) // 2,
                             offset=self._data_start + begin).reshape(shape).copy()

    def get_f16(self, name: str) -> np.ndarray:
        """The tensor as uint16 IEEE half bits: F16 as stored, other float dtypes rounded (RNE).
        A value beyond fp16's range would become inf: refused with a ModelLoadError."""
        dtype = self.dtype(name)
        if dtype == "F16":
            return self._bits16(name)
        x = self.get_f32(name)
        with np.errstate(over="ignore"):
            h = x.astype(np.float16)
        if not np.array_equal(np.isinf(h), np.isinf(x)):
            raise ModelLoadError(f"tensor {name} ({dtype}) has values beyond fp16's range (65504)")
        return h.view(np.uint16)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
        self._f.close()


def open_checkpoint(model_dir: Path) -> dict[str, SafetensorsFile]:
    """tensor name -> the file holding it, for model.safetensors or a sharded index."""
    index = model_dir / "model.safetensors.index.json"
    single = model_dir / "model.safetensors"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ModelLoadError(f"{index} is malformed (no weight_map)") from None
        files: dict[str, SafetensorsFile] = {}
        out = {}
        for name, shard in weight_map.items():
            if shard not in files:
                shard_path = model_dir / shard
                if not shard_path.exists():
                    raise ModelLoadError(f"{index} names shard {shard}, which is missing from {model_dir}")
                files[shard] = SafetensorsFile(shard_path)
            if name not in files[shard].tensors:
                raise ModelLoadError(f"{index} places {name!r} in {shard}, which does not hold it")
            out[name] = files[shard]
        return out
    if single.exists():
        f = SafetensorsFile(single)
        return {name: f for name in f.tensors}
    shards = sorted(model_dir.glob("*.safetensors"))
    if len(shards) == 1:
        f = SafetensorsFile(shards[0])
        return {name: f for name in f.tensors}
    raise ModelLoadError(
        f"{model_dir} has no model.safetensors"
        + (" and no model.safetensors.index.json for its shards" if shards else "")
    )


def save_file(tensors: dict[str, np.ndarray], path: Path, bf16: bool = False) -> None:
    """Write float arrays as safetensors (F32, F16, or BF16 when `bf16`: round to nearest even)."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        if bf16 and arr.dtype == np.float32:
            data, dt = f32_to_bf16_bits(arr).tobytes(), "BF16"
        else:
            dt = {np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("int64"): "I64",
                  np.dtype("int32"): "I32"}[arr.dtype]
            data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)
