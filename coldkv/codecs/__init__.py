"""Public codec API: KV formats (quantize/dequantize/requantize) and rANS cold slots.

See docs/formats.md for the byte layouts.
"""
from coldkv.codecs.formats import (
    dequantize,
    e2m1_decode,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    quantize,
    requantize,
)
from coldkv.codecs.packed import FORMATS, Packed, check_format
from coldkv.codecs.slots import (
    CorruptSlotError,
    decode_cold_page,
    encode_cold_page,
    rans_decode,
    rans_encode,
)

__all__ = [
    "FORMATS", "Packed", "check_format",
    "e2m1_encode", "e2m1_decode", "e4m3_encode", "e4m3_decode",
    "quantize", "dequantize", "requantize",
    "CorruptSlotError", "rans_encode", "rans_decode", "encode_cold_page", "decode_cold_page",
]
