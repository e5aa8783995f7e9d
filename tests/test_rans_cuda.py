"""CUDA rANS kernels: encoder kernel == CPU bytes, warp decoder == CPU decoder, corrupt slots.

Without a GPU these run under the simulator (tests/cudasim_warp.py supplies ballot/popc), so the
shapes are small; the `gpu` tests repeat them on thousands of full-size pages.
"""
from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from coldkv.codecs import CorruptSlotError, Packed, decode_cold_page, encode_cold_page
from coldkv.codecs.slots import decode_cold_pages_gpu, encode_cold_pages_gpu, slot_alloc_bytes
from coldkv.numba_kernels import rans as K
from rans_pages import random_page


def _cpu_like_gpu(blob: bytes):
    """What the GPU decoder must return for a blob laid in a pool: the slot may be read up to its
    allocation (zero filled), so decode the header's length of the zero-padded blob on the CPU.
    Returns a Packed, or None when the CPU decoder reports corruption."""
    padded = blob + bytes(slot_alloc_bytes(blob) - len(blob))
    if len(padded) & 1:
        padded += b"\0"
    h = np.zeros(9, np.int64)
    if K.cpu_parse_page_header(np.frombuffer(padded, np.uint16), 0, slot_alloc_bytes(blob), h) != K.OK:
        return None
    try:
        return decode_cold_page(padded[: h[7]])
    except CorruptSlotError:
        return None


def _check_restore(blobs, n_codes, n_scales):
    codes, scales, gbits, status = decode_cold_pages_gpu(blobs, n_codes, n_scales)
    for i, blob in enumerate(blobs):
        ref = _cpu_like_gpu(blob)
        assert (status[i] == K.OK) == (ref is not None), (i, status[i])
        if ref is not None:
            assert np.array_equal(codes[i, : ref.codes.size], ref.codes.ravel())
            assert np.array_equal(scales[i, : ref.scales.size], ref.scales.ravel())
            assert gbits[i] == np.float32(ref.global_scale).view(np.uint32)


def _pages(fmt, tokens, head_dim, count, seed=0):
    kinds = ("outlier", "laplace", "gaussian")
    return [random_page(fmt, kinds[i % 3], tokens, head_dim, seed=seed + i) for i in range(count)]


# ---------------------------------------------------------------------------- simulator-sized

@pytest.mark.parametrize("fmt,tokens", [("c4g64", 16), ("nvfp4", 8)])
def test_encode_kernel_matches_cpu(fmt, tokens):
    pages = _pages(fmt, tokens, 64, 3)
    cpu = [encode_cold_page(p) for p in pages]
    assert encode_cold_pages_gpu(pages) == cpu
    assert any(b[3] & K.F_CODED for b in cpu) == (fmt == "c4g64")  # tiny nvfp4 pages stay raw


def test_restore_kernel_round_trip():
    pages = _pages("c4g64", 16, 64, 3)
    blobs = [encode_cold_page(p) for p in pages]
    codes, scales, gbits, status = decode_cold_pages_gpu(blobs, 16 * 32, 16)
    assert status.tolist() == [0, 0, 0]
    for i, p in enumerate(pages):
        assert np.array_equal(codes[i], p.codes.ravel()) and np.array_equal(scales[i], p.scales.ravel())
        assert gbits[i] == np.float32(p.global_scale).view(np.uint32)


def test_restore_kernel_corrupt_slots():
    rng = np.random.default_rng(3)
    good = encode_cold_page(random_page("c4g64", "outlier", 16, 64, seed=1))
    raw = encode_cold_page(random_page("nvfp4", "gaussian", 2, 64, seed=2))
    blobs = []
    for base in (good, good, good, raw):
        m = bytearray(base)
        i = int(rng.integers(0, len(m)))
        m[i] ^= 1 << int(rng.integers(0, 8))
        blobs.append(bytes(m))
    blobs += [good[: len(good) // 2], bytes(rng.integers(0, 256, 40, dtype=np.uint8)), good[:40] + bytes(300)]
    _check_restore(blobs, 16 * 32, 16 * 4)


def test_restore_kernel_scales_in_the_coded_region():
    """Enough scale bytes (segment B, two tables) to reach the coded steps, not only the payload."""
    rng = np.random.default_rng(4)
    nib = rng.choice(16, (32, 64), p=np.r_[0.7, np.full(15, 0.02)]).astype(np.uint8)
    codes = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    scales = rng.integers(40, 80, (32, 4)).astype(np.uint8)
    p = Packed("nvfp4", codes, scales, 2.5, 64)
    blob = encode_cold_page(p)
    assert blob[3] & K.F_CODED and 32 * 32 + 32 * 4 - K.TAIL > 32 * 32  # B partly coded
    assert encode_cold_pages_gpu([p]) == [blob]
    c, sc, g, status = decode_cold_pages_gpu([blob], 32 * 32, 32 * 4)
    assert status[0] == 0 and np.array_equal(c[0], codes.ravel()) and np.array_equal(sc[0], scales.ravel())


@cuda.jit
def _decode_into_shared(pool16, base, nbytes, out_codes, out_scales, status):
    # what an attention kernel does with a sentinel page: one warp decodes it into shared memory
    tab = cuda.shared.array(1024, np.uint32)
    codes = cuda.shared.array(512, np.uint8)
    scales = cuda.shared.array(16, np.uint8)
    h = cuda.local.array(9, np.int64)
    err = K.warp_decode_page(pool16, base, nbytes, codes, 0, 512, scales, 0, 16, h, tab)
    cuda.syncwarp(0xFFFFFFFF)
    for i in range(cuda.laneid, 512, 32):
        out_codes[i] = codes[i]
    if cuda.laneid < 16:
        out_scales[cuda.laneid] = scales[cuda.laneid]
    if cuda.laneid == 0:
        status[0] = err


def test_warp_decode_into_shared_memory():
    p = random_page("c4g64", "outlier", 16, 64, seed=7)
    blob = encode_cold_page(p)
    assert blob[3] & K.F_CODED
    pool = np.zeros(64 + slot_alloc_bytes(blob), np.uint8)
    pool[64: 64 + len(blob)] = np.frombuffer(blob, np.uint8)
    codes, scales, status = np.zeros(512, np.uint8), np.zeros(16, np.uint8), np.full(1, -1, np.int32)
    d = [cuda.to_device(a) for a in (codes, scales, status)]
    _decode_into_shared[1, 32](cuda.to_device(pool.view(np.uint16)), 32, slot_alloc_bytes(blob), *d)
    codes, scales, status = (a.copy_to_host() for a in d)
    assert status[0] == 0
    assert np.array_equal(codes, p.codes.ravel()) and np.array_equal(scales, p.scales.ravel())


# ---------------------------------------------------------------------------- real GPU

@pytest.mark.gpu
@pytest.mark.parametrize("fmt,head_dim,count", [("c4g64", 128, 3000), ("c4g64", 256, 1000), ("c4g64", 64, 1000),
                                                 ("nvfp4", 128, 1000), ("iso3", 256, 500)])
def test_gpu_large_batches(fmt, head_dim, count):
    pages = _pages(fmt, 64, head_dim, count, seed=head_dim)
    cpu = [encode_cold_page(p) for p in pages]
    gpu = encode_cold_pages_gpu(pages)
    assert gpu == cpu
    group = 64 if fmt == "c4g64" else 16
    codes, scales, gbits, status = decode_cold_pages_gpu(cpu, 64 * head_dim // 2, 64 * head_dim // group)
    assert (status == 0).all()
    for i, p in enumerate(pages):
        assert np.array_equal(codes[i], p.codes.ravel()) and np.array_equal(scales[i], p.scales.ravel())


@pytest.mark.gpu
def test_gpu_corrupt_slots():
    rng = np.random.default_rng(11)
    bases = [encode_cold_page(p) for p in _pages("c4g64", 64, 128, 12)]
    blobs = []
    for k in range(6000):
        m = bytearray(bases[k % len(bases)])
        if k % 3 == 0:
            m = m[: int(rng.integers(0, len(m)))]
        elif k % 3 == 1:
            for _ in range(int(rng.integers(1, 4))):
                i = int(rng.integers(0, len(m)))
                m[i] ^= 1 << int(rng.integers(0, 8))
        else:
            i = int(rng.integers(0, len(m)))
            m[i:] = rng.integers(0, 256, len(m) - i, dtype=np.uint8).tobytes()
        blobs.append(bytes(m) if len(m) else b"\0")
    _check_restore(blobs, 64 * 64, 64 * 2)


# ---------------------------------------------------------------------------- decoder internals
# (register window of stream words, segment switch, table layouts, table reuse, corrupt slots)

@cuda.jit
def _decode_section_kernel(s16, off, na, one_a, nb, one_b, words, out_a, out_b, status):
    tab = cuda.shared.array(1024, np.uint32)
    err = K.warp_decode_section(s16, 0, off, na, one_a, nb, one_b, words, out_a, 0, out_b, 0, tab)
    if cuda.laneid == 0:
        status[0] = err


def _gpu_section(blob16, off, na, one_a, nb, one_b, words):
    out_a, out_b = np.zeros(max(na, 1), np.uint8), np.zeros(max(nb, 1), np.uint8)
    d = [cuda.to_device(a) for a in (out_a, out_b, np.full(1, -1, np.int32))]
    _decode_section_kernel[1, 32](cuda.to_device(blob16), off, na, one_a, nb, one_b, words, *d)
    return tuple(a.copy_to_host() for a in d)


def _skewed_bytes(rng, n):
    """Bytes whose two nibbles each follow a skewed distribution (they compress)."""
    lo = rng.choice(16, n, p=rng.dirichlet(np.full(16, 0.4)))
    hi = rng.choice(16, n, p=rng.dirichlet(np.full(16, 0.4)))
    return (lo | (hi << 4)).astype(np.uint8)


@pytest.mark.parametrize("alphabet", [16, 256])
def test_warp_decode_section_streams(alphabet):
    """Stream blobs: one table (alphabet 16) and two (256), many words (the window slides)."""
    from coldkv.codecs import rans_decode, rans_encode

    rng = np.random.default_rng(alphabet)
    sym = _skewed_bytes(rng, 2 * 1600 if alphabet == 16 else 1600) & (alphabet - 1)
    blob = rans_encode(sym, alphabet)
    assert blob[3] & K.S_CODED
    m = sym.size // 2 if alphabet == 16 else sym.size
    words = int.from_bytes(blob[8:12], "little")
    assert words > 6 * 32  # several window slides
    s16 = np.frombuffer(blob + b"\0" * (len(blob) & 1), np.uint16)
    a, _, st = _gpu_section(s16, K.STREAM_HEADER, m, alphabet == 16, 0, False, words)
    assert st[0] == K.OK
    ref = rans_decode(blob)
    got = np.stack([a & 15, a >> 4], -1).reshape(-1) if alphabet == 16 else a
    assert np.array_equal(got, ref)
    # a stored word count one too small: the lanes run out (E_OVERRUN), as on the CPU
    _, _, st = _gpu_section(s16, K.STREAM_HEADER, m, alphabet == 16, 0, False, words - 1)
    assert st[0] == K.E_OVERRUN
    _, _, st = _gpu_section(s16, K.STREAM_HEADER, m, alphabet == 16, 0, False, words - 2)
    assert st[0] == K.E_OVERRUN


@pytest.mark.parametrize("one_b,na,nb", [(True, 700, 300), (False, 1000, 37), (False, 40, 500)])
def test_warp_decode_section_two_segments(one_b, na, nb):
    """Segment B with one or two tables, the A/B switch inside a step, B-only steps."""
    rng = np.random.default_rng(na + nb)
    a, b = _skewed_bytes(rng, na), _skewed_bytes(rng, nb)
    cap = (64 + 128 + na + nb + 16) & ~3
    out = np.zeros(cap + 4, np.uint8)
    hist, freqs, states = np.zeros(64, np.int64), np.zeros(128, np.int64), np.zeros(32, np.int64)
    words = K.cpu_encode_section(a, 0, na, False, b, 0, nb, one_b, out, 0, cap, 1 << 30, hist, freqs, states)
    assert words > 0
    s16 = out.view(np.uint16)
    ra, rb = np.zeros(na, np.uint8), np.zeros(nb, np.uint8)
    assert K.cpu_decode_section(s16, 0, 0, na, False, nb, one_b, words, ra, 0, rb, 0,
                                np.zeros(1024, np.uint32), np.zeros(32, np.int64)) == K.OK
    assert np.array_equal(ra, a) and np.array_equal(rb, b)
    ga, gb, st = _gpu_section(s16, 0, na, False, nb, one_b, words)
    assert st[0] == K.OK and np.array_equal(ga[:na], a) and np.array_equal(gb[:nb], b)


@cuda.jit
def _decode_two_into_shared(pool16, bases, nbytes, out_codes, status):
    # one warp, one table buffer, two slots in a row (the tables are rebuilt over the old ones)
    tab = cuda.shared.array(1024, np.uint32)
    codes = cuda.shared.array(512, np.uint8)
    scales = cuda.shared.array(16, np.uint8)
    h = cuda.local.array(9, np.int64)
    for k in range(2):
        err = K.warp_decode_page(pool16, bases[k], nbytes[k], codes, 0, 512, scales, 0, 16, h, tab)
        cuda.syncwarp(0xFFFFFFFF)
        for i in range(cuda.laneid, 512, 32):
            out_codes[k, i] = codes[i]
        cuda.syncwarp(0xFFFFFFFF)
        if cuda.laneid == 0:
            status[k] = err


def test_warp_decode_reuses_tables():
    pages = [random_page("c4g64", "outlier", 16, 64, seed=20 + i) for i in range(2)]
    blobs = [encode_cold_page(p) for p in pages]
    assert all(b[3] & K.F_CODED for b in blobs)
    from coldkv.codecs.slots import pack_pool

    pool16, offs, alloc = pack_pool(blobs)
    out, status = np.zeros((2, 512), np.uint8), np.full(2, -1, np.int32)
    d_out, d_st = cuda.to_device(out), cuda.to_device(status)
    _decode_two_into_shared[1, 32](cuda.to_device(pool16), cuda.to_device(offs), cuda.to_device(alloc), d_out, d_st)
    out, status = d_out.copy_to_host(), d_st.copy_to_host()
    assert status.tolist() == [0, 0]
    for k, p in enumerate(pages):
        assert np.array_equal(out[k], p.codes.ravel())


def test_restore_kernel_fuzz_small():
    """A few dozen corrupt slots through the restore kernel: status and bytes as on the CPU."""
    rng = np.random.default_rng(17)
    bases = [encode_cold_page(random_page("c4g64", kind, 16, 64, seed=30 + i))
             for i, kind in enumerate(("outlier", "laplace"))]
    blobs = []
    for k in range(36):
        m = bytearray(bases[k % 2])
        if k % 4 == 0:
            m = m[: int(rng.integers(1, len(m)))]
        elif k % 4 == 1:
            i = int(rng.integers(K.SLOT_HEADER, len(m)))  # the coded body: tables, states, words
            m[i] ^= 1 << int(rng.integers(0, 8))
        elif k % 4 == 2:
            i = int(rng.integers(K.SLOT_HEADER + 48 + K.STATES_BYTES, len(m)))  # the words only
            m[i:] = rng.integers(0, 256, len(m) - i, dtype=np.uint8).tobytes()
        else:
            w = int.from_bytes(m[8:12], "little") + int(rng.choice([-3, -1, 1, 2]))  # word count
            m[8:12] = max(w, 0).to_bytes(4, "little")
        blobs.append(bytes(m))
    _check_restore(blobs, 16 * 32, 16)
