"""rANS cold slots: lossless coding of symbol streams and of whole head-pages.

The byte layouts are in docs/formats.md ("# Cold slots"); the coder and its kernels in
coldkv.numba_kernels.rans (pure-Python spec, njit CPU coder, CUDA encoder kernel, warp decoder).

Public: rans_encode / rans_decode (a symbol stream), encode_cold_page / decode_cold_page (one
head-page slot), slot_size_class / slot_alloc_bytes (what the cold pool allocates), the batched
GPU coder encode_cold_pages_gpu / decode_cold_pages_gpu, and CorruptSlotError.
"""
from __future__ import annotations

import numpy as np

from coldkv.codecs.packed import FORMATS, Packed
from coldkv.numba_kernels import rans as K


class CorruptSlotError(ValueError):
    """A cold slot (or rANS stream) blob is malformed."""


FORMAT_IDS = {"nvfp4": 2, "iso3": 3, "c4g64": 4}  # the page layout ids of DEVELOPERS.md
FORMAT_NAMES = {v: k for k, v in FORMAT_IDS.items()}

# Allocation: slots are carved in 32-byte granules (one DRAM sector; keeps 16-byte vector loads
# aligned). A page whose coded slot would not beat the raw layout is stored raw, so a slot is
# never larger than header + raw page; size class k holds k granules.
SLOT_GRANULE = 32


def slot_size_class(blob_or_len) -> int:
    """Size class of a slot: the number of 32-byte granules it occupies."""
    n = blob_or_len if isinstance(blob_or_len, (int, np.integer)) else len(blob_or_len)
    return (int(n) + SLOT_GRANULE - 1) // SLOT_GRANULE


def slot_alloc_bytes(blob_or_len) -> int:
    """Bytes the cold pool allocates for a slot (its size class times the granule)."""
    return slot_size_class(blob_or_len) * SLOT_GRANULE


def _raise(err: int) -> None:
    raise CorruptSlotError(K.ERROR_TEXT.get(err, f"error {err}"))


def _words(blob: bytes) -> np.ndarray:
    """The blob as little-endian uint16 words (a zero byte appended to odd lengths, never read)."""
    b = bytes(blob)
    if len(b) & 1:
        b += b"\0"
    return np.frombuffer(b, dtype="<u2").astype(np.uint16)


def _scratch():
    return np.zeros(64, np.int64), np.zeros(128, np.int64), np.zeros(32, np.int64)


# ----------------------------------------------------------------------------------------------
# Symbol streams
# ----------------------------------------------------------------------------------------------

def rans_encode(symbols, alphabet: int = 16) -> bytes:
    """Losslessly code a 1-D array of symbols < alphabet (16: nibbles, 256: bytes)."""
    if alphabet not in (16, 256):
        raise ValueError("alphabet must be 16 or 256")
    sym = np.asarray(symbols)
    if sym.ndim != 1 or (sym.size and not np.issubdtype(sym.dtype, np.integer)):
        raise ValueError("symbols must be a 1-D integer array")
    if sym.size and (sym.min() < 0 or sym.max() >= alphabet):
        raise ValueError(f"symbols must lie in [0, {alphabet})")
    if sym.size >= 1 << 32:
        raise ValueError("at most 2^32 - 1 symbols")
    n = int(sym.size)
    sym = sym.astype(np.uint8)
    if alphabet == 16:  # two nibbles per coded byte (element 2i low); odd tail padded with itself
        if n & 1:
            sym = np.append(sym, sym[-1])
        data = (sym[0::2] | (sym[1::2] << 4)).astype(np.uint8)
    else:
        data = sym
    one_table = alphabet == 16
    m = int(data.size)
    raw_len = (m + 3) & ~3
    out = np.zeros(K.STREAM_HEADER + raw_len, np.uint8)
    words = -1
    if m:
        words = K.cpu_encode_section(data, 0, m, one_table, data, 0, 0, False, out, K.STREAM_HEADER,
                                     raw_len, (1 << 32) - 1, *_scratch())
    flags = K.S_BYTES if alphabet == 256 else 0
    if words >= 0:
        flags |= K.S_CODED
        length = K.STREAM_HEADER + K.coded_section_bytes(one_table, 0, False, words)
    else:
        words = 0
        length = K.STREAM_HEADER + K.cpu_put_raw(data, 0, m, out, K.STREAM_HEADER)
    header = np.array([K.STREAM_MAGIC | (K.SLOT_VERSION << 16) | (flags << 24), n, words], "<u4")
    out[: K.STREAM_HEADER] = header.view(np.uint8)
    return out[:length].tobytes()


def rans_decode(blob) -> np.ndarray:
    """Inverse of rans_encode: the symbols as a uint8 array. CorruptSlotError if malformed."""
    blob = bytes(blob)
    if len(blob) < K.STREAM_HEADER:
        raise CorruptSlotError("blob shorter than the stream header")
    magic, version, flags = int.from_bytes(blob[0:2], "little"), blob[2], blob[3]
    n = int.from_bytes(blob[4:8], "little")
    words = int.from_bytes(blob[8:12], "little")
    if magic != K.STREAM_MAGIC or version != K.SLOT_VERSION or flags & ~K.STREAM_FLAGS_MASK:
        _raise(K.E_HEADER)
    alphabet = 256 if flags & K.S_BYTES else 16
    one_table = alphabet == 16
    m = (n + 1) // 2 if alphabet == 16 else n
    coded = bool(flags & K.S_CODED)
    if coded:
        if m == 0 or m > K.STEPS_PER_WORD * (words + K.LANES) + K.TAIL:
            _raise(K.E_HEADER)
        length = K.STREAM_HEADER + K.coded_section_bytes(one_table, 0, False, words)
    else:
        if words:
            _raise(K.E_HEADER)
        length = K.STREAM_HEADER + ((m + 3) & ~3)
    if length != len(blob):
        _raise(K.E_LENGTH)
    s16 = _words(blob)
    data = np.empty(m, np.uint8)
    if coded:
        err = K.cpu_decode_section(s16, 0, K.STREAM_HEADER, m, one_table, 0, False, words, data, 0,
                                   data, 0, np.zeros(1024, np.uint32), np.zeros(32, np.int64))
    else:
        err = K.cpu_get_raw(s16, 0, K.STREAM_HEADER, m, data, 0)
    if err != K.OK:
        _raise(err)
    if alphabet == 256:
        return data
    out = np.empty(2 * m, np.uint8)
    out[0::2] = data & 15
    out[1::2] = data >> 4
    return out[:n]


# ----------------------------------------------------------------------------------------------
# Head-page slots
# ----------------------------------------------------------------------------------------------

def _page_arrays(p: Packed):
    if p.fmt not in FORMAT_IDS:
        raise ValueError(f"cold slots hold nvfp4, iso3 or c4g64 pages, not {p.fmt!r}")
    group = FORMATS[p.fmt][3]
    tokens = p.codes.shape[0] if p.codes.ndim == 2 else -1
    head_dim = p.head_dim or 2 * p.codes.shape[-1]
    if (p.codes.dtype != np.uint8 or p.scales.dtype != np.uint8 or p.codes.shape != (tokens, head_dim // 2)
            or p.scales.shape != (tokens, head_dim // group) or head_dim % group):
        raise ValueError(f"{p.fmt} page needs uint8 codes [T, D/2] and scales [T, D/{group}]")
    if not (0 < tokens < 1 << 16 and 0 < head_dim < 1 << 16):
        raise ValueError("tokens and head_dim must lie in [1, 65535]")
    codes = np.ascontiguousarray(p.codes).reshape(-1)
    scales = np.ascontiguousarray(p.scales).reshape(-1)
    gbits = int(np.float32(p.global_scale).view(np.uint32))
    return codes, scales, FORMAT_IDS[p.fmt], tokens, head_dim, gbits


def encode_cold_page(p: Packed) -> bytes:
    """One head-page (nvfp4, iso3 or c4g64) -> its slot bytes (coded sections where that pays)."""
    codes, scales, fmt, tokens, head_dim, gbits = _page_arrays(p)
    out = np.zeros(K.slot_capacity(codes.size, scales.size), np.uint8)
    length = K.cpu_encode_page(codes, 0, scales, 0, fmt, tokens, head_dim, gbits, out, 0, *_scratch())
    return out[:length].tobytes()


def _packed_from(h, codes, scales) -> Packed:
    fmt = FORMAT_NAMES[int(h[0])]
    tokens, head_dim = int(h[1]), int(h[2])
    gscale = float(np.uint32(h[8]).view(np.float32))
    return Packed(fmt, codes.reshape(tokens, head_dim // 2),
                  scales.reshape(tokens, head_dim // FORMATS[fmt][3]), gscale, head_dim)


def decode_cold_page(blob) -> Packed:
    """Slot bytes -> the exact Packed page. CorruptSlotError for any malformed blob."""
    blob = bytes(blob)
    s16 = _words(blob)
    h = np.zeros(9, np.int64)
    err = K.cpu_parse_page_header(s16, 0, len(blob), h)
    if err != K.OK:
        _raise(err)
    if h[7] != len(blob):
        _raise(K.E_LENGTH)
    codes = np.empty(int(h[4]), np.uint8)
    scales = np.empty(int(h[5]), np.uint8)
    err = K.cpu_decode_page(s16, 0, h, codes, scales, np.zeros(1024, np.uint32), np.zeros(32, np.int64))
    if err != K.OK:
        _raise(err)
    return _packed_from(h, codes, scales)


# ----------------------------------------------------------------------------------------------
# Batched GPU coder (many pages of one format and shape at once)
# ----------------------------------------------------------------------------------------------

def encode_cold_pages_gpu(pages: list[Packed]) -> list[bytes]:
    """Encode pages of one format and shape with the CUDA encoder kernel (byte-identical to CPU)."""
    from numba import cuda

    arrs = [_page_arrays(p) for p in pages]
    fmt, tokens, head_dim = arrs[0][2:5]
    if any(a[2:5] != (fmt, tokens, head_dim) for a in arrs):
        raise ValueError("encode_cold_pages_gpu needs pages of one format and shape")
    codes = np.stack([a[0] for a in arrs])
    scales = np.stack([a[1] for a in arrs])
    gbits = np.array([a[5] for a in arrs], np.uint32)
    out = np.zeros((len(pages), K.slot_capacity(codes.shape[1], scales.shape[1])), np.uint8)
    lengths = np.zeros(len(pages), np.int32)
    d_out, d_len = cuda.to_device(out), cuda.to_device(lengths)
    threads = 64
    K.encode_pages_kernel[(len(pages) + threads - 1) // threads, threads](
        cuda.to_device(codes), cuda.to_device(scales), cuda.to_device(gbits), fmt, tokens, head_dim,
        d_out, d_len)
    out, lengths = d_out.copy_to_host(), d_len.copy_to_host()
    return [out[i, : lengths[i]].tobytes() for i in range(len(pages))]


def pack_pool(blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lay slots out as the cold pool does: each at a granule boundary, its allocation readable.

    Returns (pool uint16[W], slot word offsets int64[P], slot allocation bytes int32[P]).
    """
    alloc = np.array([slot_alloc_bytes(b) for b in blobs], np.int64)
    offs = np.concatenate([[0], np.cumsum(alloc)[:-1]]).astype(np.int64)
    pool = np.zeros(int(alloc.sum()) + 2, np.uint8)
    for o, b in zip(offs, blobs):
        pool[o: o + len(b)] = np.frombuffer(b, np.uint8)
    return pool.view(np.uint16), offs // 2, alloc.astype(np.int32)


def decode_cold_pages_gpu(blobs: list[bytes], n_codes: int, n_scales: int):
    """Restore slots with the CUDA restore kernel (a warp per slot).

    Returns (codes uint8[P, n_codes], scales uint8[P, n_scales], global bits uint32[P],
    status int32[P]); status 0 = ok, else a coldkv.numba_kernels.rans error code.
    """
    from numba import cuda

    pool16, offs, alloc = pack_pool(blobs)
    p = len(blobs)
    d_codes = cuda.device_array((p, n_codes), np.uint8)
    d_scales = cuda.device_array((p, n_scales), np.uint8)
    d_g = cuda.device_array(p, np.uint32)
    d_st = cuda.device_array(p, np.int32)
    K.restore_pages_kernel[(p + K.RESTORE_WARPS - 1) // K.RESTORE_WARPS, 32 * K.RESTORE_WARPS](
        cuda.to_device(pool16), cuda.to_device(offs), cuda.to_device(alloc), d_codes, d_scales, d_g, d_st)
    return d_codes.copy_to_host(), d_scales.copy_to_host(), d_g.copy_to_host(), d_st.copy_to_host()


__all__ = [
    "CorruptSlotError", "rans_encode", "rans_decode", "encode_cold_page", "decode_cold_page",
    "slot_size_class", "slot_alloc_bytes", "SLOT_GRANULE", "encode_cold_pages_gpu",
    "decode_cold_pages_gpu", "pack_pool",
]
