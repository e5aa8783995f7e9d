"""`Packed`: a block of quantized KV (usually one head-page) as plain numpy arrays.

Shared by the format codecs (quantize/dequantize/requantize), the cold-slot coder and the paged
cache. A head-page is one (layer, kv_head, K or V) plane of `page_tokens` tokens x `head_dim`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# name -> (codes dtype, code columns per value, scale dtype, values per scale or 0 for none,
#          has a fp32 second-level scale). Codes of the 4-bit formats are two per byte, element 2i
#          in the low nibble. E4M3 scales are stored as their raw bytes (uint8).
FORMATS: dict[str, tuple[np.dtype, float, np.dtype | None, int, bool]] = {
    "bf16": (np.dtype(np.uint16), 1.0, None, 0, False),  # raw bf16 bits
    "int8": (np.dtype(np.int8), 1.0, np.dtype(np.float32), -1, False),  # -1: one scale per token
    "nvfp4": (np.dtype(np.uint8), 0.5, np.dtype(np.uint8), 16, True),  # E2M1 + E4M3 per 16
    "iso3": (np.dtype(np.uint8), 0.5, np.dtype(np.uint8), 16, True),  # sign+3-bit + E4M3 per 16
    "c4g64": (np.dtype(np.uint8), 0.5, np.dtype(np.uint8), 64, True),  # E2M1 + E4M3 per 64
}


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown KV format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return fmt


@dataclass(frozen=True, eq=False)
class Packed:
    fmt: str
    codes: np.ndarray  # [tokens, head_dim] (bf16 bits, int8) or [tokens, head_dim // 2] (4-bit)
    scales: np.ndarray  # [tokens] fp32 (int8), [tokens, head_dim // group] E4M3 bytes, or [tokens, 0]
    global_scale: float = 1.0  # fp32 second-level scale (nvfp4, iso3, c4g64); 1.0 otherwise
    head_dim: int = 0

    @property
    def tokens(self) -> int:
        return int(self.codes.shape[0])

    @property
    def nbytes(self) -> int:
        """Real storage: codes + scales + the fp32 second-level scale where the format has one."""
        has_global = FORMATS[self.fmt][4]
        return int(self.codes.nbytes + self.scales.nbytes + (4 if has_global else 0))

    def equal(self, other: "Packed") -> bool:
        """Bit-exact equality of two packed blocks (what lossless coding must preserve)."""
        return (
            self.fmt == other.fmt
            and self.head_dim == other.head_dim
            and np.float32(self.global_scale).tobytes() == np.float32(other.global_scale).tobytes()
            and self.codes.dtype == other.codes.dtype
            and np.array_equal(self.codes, other.codes)
            and self.scales.dtype == other.scales.dtype
            and np.array_equal(self.scales, other.scales)
        )
