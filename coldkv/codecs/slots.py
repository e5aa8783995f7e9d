"""rANS cold slots (placeholder until the coder lands)."""


class CorruptSlotError(ValueError):
    """A cold slot blob is malformed."""


def _todo(*args, **kwargs):
    raise NotImplementedError("coldkv.codecs rANS slots are being written (issue 3)")


rans_encode = rans_decode = encode_cold_page = decode_cold_page = _todo

__all__ = ["CorruptSlotError", "rans_encode", "rans_decode", "encode_cold_page", "decode_cold_page"]
