"""Public codec API: KV formats (quantize/dequantize/requantize) and rANS cold slots.

See docs/formats.md for the byte layouts.
"""
from coldkv.codecs.packed import FORMATS, Packed, check_format

__all__ = ["FORMATS", "Packed", "check_format"]
