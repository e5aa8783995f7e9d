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
