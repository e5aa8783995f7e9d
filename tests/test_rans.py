"""rANS streams and cold-page slots on the CPU: spec agreement, round trips, sizes, fuzzing."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coldkv.codecs import CorruptSlotError, Packed, decode_cold_page, encode_cold_page, rans_decode, rans_encode
from coldkv.codecs.slots import SLOT_GRANULE, slot_alloc_bytes, slot_size_class
from coldkv.numba_kernels import rans as K
from rans_pages import random_page

SCRATCH = dict(hist=np.zeros(64, np.int64), freqs=np.zeros(128, np.int64), states=np.zeros(32, np.int64))


def _symbols(seed: int, n: int, alphabet: int, concentration: float) -> np.ndarray:
    """n symbols from a random distribution (small concentration: few dominant symbols)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(alphabet, concentration))
    return rng.choice(alphabet, n, p=p).astype(np.uint8)


def _entropy_bytes(s: np.ndarray, alphabet: int) -> float:
    c = np.bincount(s, minlength=alphabet) / s.size
    c = c[c > 0]
    return float(-(c * np.log2(c)).sum() * s.size / 8)


# ---------------------------------------------------------------------------- frequency tables

@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=16, max_size=16).filter(lambda h: sum(h) > 0))
def test_quantize_freqs_matches_spec(hist):
    ref = K.ref_quantize_freqs(hist)
    assert sum(ref) == 256 and max(ref) <= 255
    assert all((f >= 1) == (c > 0) or (c == 0) for f, c in zip(ref, hist))
    assert all(f >= 1 for f, c in zip(ref, hist) if c > 0)
    out = np.zeros(16, np.int64)
    K.cpu_quantize_freqs(np.array(hist, np.int64), 0, out, 0)
    assert out.tolist() == ref


def test_quantize_single_symbol():
    f = K.ref_quantize_freqs([0] * 5 + [100] + [0] * 10)
    assert f[5] == 255 and sum(f) == 256


# ---------------------------------------------------------------------------- spec == njit

@pytest.mark.parametrize("na,nb", [(1, 0), (95, 0), (96, 0), (97, 0), (333, 0), (500, 7), (2048, 64), (40, 300)])
@pytest.mark.parametrize("one_a", [True, False])
def test_njit_section_matches_spec(na, nb, one_a):
    rng = np.random.default_rng(na * 7 + nb)
    a = _symbols(na, na, 256, 0.3)
    b = rng.integers(40, 60, max(nb, 1)).astype(np.uint8)[:nb] if nb else np.zeros(1, np.uint8)
    tables, states, words = K.ref_encode_section(a.tobytes(), one_a, b[:nb].tobytes(), False)
    assert K.ref_decode_section(na, nb, tables, states, words) == a.tobytes() + b[:nb].tobytes()
    out = np.zeros(K.section_tables_bytes(one_a, nb, False) + 128 + 4 * (na + nb) + 64, np.uint8)
    n_words = K.cpu_encode_section(a, 0, na, one_a, b, 0, nb, False, out, 0, out.size, 1 << 31,
                                   SCRATCH["hist"], SCRATCH["freqs"], SCRATCH["states"])
    assert n_words == len(words)
    tb = K.section_tables_bytes(one_a, nb, False)
    expect_tables = tables[0] + ([] if one_a else tables[1]) + ((tables[2] + tables[3]) if nb else [])
    assert out[:tb].tolist() == expect_tables
    assert out[tb: tb + 128].view("<u4").tolist() == states
    assert out[tb + 128: tb + 128 + 2 * n_words].view("<u2").tolist() == words
    # and the njit decoder reads it back
    s16 = out.view(np.uint16)
    da, db = np.zeros(na, np.uint8), np.zeros(max(nb, 1), np.uint8)
    err = K.cpu_decode_section(s16, 0, 0, na, one_a, nb, False, n_words, da, 0, db, 0,
                               np.zeros(1024, np.uint32), np.zeros(32, np.int64))
    assert err == K.OK and np.array_equal(da, a) and np.array_equal(db[:nb], b[:nb])


# ---------------------------------------------------------------------------- streams

@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 3000), alphabet=st.sampled_from([16, 256]),
       concentration=st.sampled_from([0.05, 0.3, 1.0, 10.0]))
def test_stream_round_trip(seed, n, alphabet, concentration):
    s = _symbols(seed, n, alphabet, concentration)
    blob = rans_encode(s, alphabet)
    out = rans_decode(blob)
    assert out.dtype == np.uint8 and np.array_equal(out, s)
    raw = K.STREAM_HEADER + (((n + 1) // 2 if alphabet == 16 else n) + 3) // 4 * 4
    assert len(blob) <= raw  # never worse than the raw fallback


@pytest.mark.parametrize("alphabet", [16, 256])
@pytest.mark.parametrize("case", ["empty", "one", "two", "constant", "once_in_16k", "max_symbol", "31", "33",
                                  "97", "all_symbols_once"])
def test_stream_degenerate(alphabet, case):
    top = alphabet - 1
    s = {
        "empty": np.zeros(0, np.uint8),
        "one": np.array([top], np.uint8),
        "two": np.array([0, top], np.uint8),
        "constant": np.full(16384, 3, np.uint8),
        "once_in_16k": np.where(np.arange(16384) == 9000, top, 1).astype(np.uint8),
        "max_symbol": np.full(1000, top, np.uint8),
        "31": (np.arange(31) % alphabet).astype(np.uint8),
        "33": (np.arange(33) % alphabet).astype(np.uint8),
        "97": (np.arange(97) * 7 % alphabet).astype(np.uint8),
        "all_symbols_once": np.arange(alphabet).astype(np.uint8),
    }[case]
    out = rans_decode(rans_encode(s, alphabet))
    assert np.array_equal(out, s)


def test_stream_rejects_bad_input():
    with pytest.raises(ValueError):
        rans_encode(np.array([16]), 16)
    with pytest.raises(ValueError):
        rans_encode(np.array([1, 2]), 17)
    with pytest.raises(ValueError):
        rans_encode(np.zeros((2, 2), np.uint8))


def test_stream_size_near_entropy():
    """A 16k-symbol page costs at most 2% over its order-0 entropy, header included."""
    for seed, conc in [(1, 1.0), (2, 3.0), (3, 10.0)]:
        s = _symbols(seed, 16384, 16, conc)
        h = _entropy_bytes(s, 16)
        assert len(rans_encode(s, 16)) <= 1.02 * h + 1, (seed, len(rans_encode(s, 16)), h)


def test_constant_stream_is_tiny():
    assert len(rans_encode(np.full(16384, 5, np.uint8), 16)) < 200


# ---------------------------------------------------------------------------- pages

PAGE_CASES = [(fmt, kind, d) for fmt in ("c4g64", "nvfp4", "iso3") for kind in ("gaussian", "laplace", "outlier")
              for d in (64, 128, 256)]


@pytest.mark.parametrize("fmt,kind,head_dim", PAGE_CASES)
def test_page_round_trip(fmt, kind, head_dim):
    p = random_page(fmt, kind, 64, head_dim, seed=head_dim)
    blob = encode_cold_page(p)
    q = decode_cold_page(blob)
    assert p.equal(q)
    assert len(blob) <= p.nbytes + K.SLOT_HEADER - 4  # raw fallback bound
    assert slot_alloc_bytes(blob) % SLOT_GRANULE == 0 and slot_alloc_bytes(blob) >= len(blob)
    assert slot_size_class(blob) == slot_alloc_bytes(blob) // SLOT_GRANULE


def test_page_outliers_compress():
    """Outlier-channel K pages are where coding pays: well below the raw c4g64 page."""
    p = random_page("c4g64", "outlier", 64, 128, seed=5)
    assert slot_alloc_bytes(encode_cold_page(p)) < 0.8 * p.nbytes


@pytest.mark.parametrize("tokens,head_dim", [(1, 64), (3, 64), (7, 128), (64, 16)])
def test_page_small_shapes(tokens, head_dim):
    for fmt in ("nvfp4", "iso3"):
        p = random_page(fmt, "laplace", tokens, head_dim, seed=tokens)
        assert decode_cold_page(encode_cold_page(p)).equal(p)


def test_page_degenerate_codes():
    """All-zero codes, one code only, a code seen once; odd global scales (negative, nan, inf)."""
    t, d = 64, 128
    base = np.zeros((t, d // 2), np.uint8)
    once = base.copy()
    once[17, 5] = 0x70
    cases = [base, np.full((t, d // 2), 0x77, np.uint8), once]
    for codes in cases:
        for g in (1.0, -3.5, float("nan"), float("inf"), 0.0):
            p = Packed("c4g64", codes, np.full((t, d // 64), 56, np.uint8), g, d)
            q = decode_cold_page(encode_cold_page(p))
            assert p.equal(q)
    assert len(encode_cold_page(Packed("c4g64", base, np.zeros((t, 2), np.uint8), 1.0, d))) < 200


def test_page_rejects_other_formats():
    with pytest.raises(ValueError):
        encode_cold_page(Packed("int8", np.zeros((4, 64), np.int8), np.ones(4, np.float32), 1.0, 64))
    with pytest.raises(ValueError):
        encode_cold_page(Packed("c4g64", np.zeros((4, 32), np.uint8), np.zeros((4, 2), np.uint8), 1.0, 64))


# ---------------------------------------------------------------------------- fuzz

def _valid_blobs():
    blobs = [encode_cold_page(random_page(f, k, t, d, seed=i))
             for i, (f, k, t, d) in enumerate([("c4g64", "outlier", 64, 64), ("nvfp4", "laplace", 16, 64),
                                               ("c4g64", "gaussian", 8, 64), ("iso3", "outlier", 32, 128)])]
    streams = [rans_encode(_symbols(i, n, a, 0.5), a) for i, (n, a) in enumerate([(700, 16), (300, 256), (5, 16)])]
    return blobs, streams


def _check_page(blob: bytes) -> None:
    """The only acceptable outcomes: CorruptSlotError, or a well-formed page that re-encodes to
    a slot decoding to the same page (no other exception, no out-of-bounds access)."""
    try:
        p = decode_cold_page(blob)
    except CorruptSlotError:
        return
    assert p.codes.dtype == np.uint8 and p.codes.shape == (p.tokens, p.head_dim // 2)
    assert decode_cold_page(encode_cold_page(p)).equal(p)


def _check_stream(blob: bytes) -> None:
    try:
        s = rans_decode(blob)
    except CorruptSlotError:
        return
    alphabet = 256 if blob[3] & K.S_BYTES else 16
    assert s.dtype == np.uint8 and (s.size == 0 or s.max() < alphabet)
    assert np.array_equal(rans_decode(rans_encode(s, alphabet)), s)


def _mutations(blob: bytes, rng: np.random.Generator, count: int):
    b = np.frombuffer(blob, np.uint8)
    for k in range(count):
        kind = k % 4
        if kind == 0:  # flip 1-3 bits
            m = b.copy()
            for _ in range(rng.integers(1, 4)):
                i = rng.integers(0, m.size)
                m[i] ^= np.uint8(1 << rng.integers(0, 8))
            yield m.tobytes()
        elif kind == 1:  # truncate
            yield blob[: rng.integers(0, len(blob))]
        elif kind == 2:  # random bytes behind a valid header
            m = b.copy()
            i = rng.integers(0, m.size)
            m[i:] = rng.integers(0, 256, m.size - i, dtype=np.uint8)
            yield m.tobytes()
        else:  # random blob of random length, or extended
            yield (rng.integers(0, 256, rng.integers(0, 64), dtype=np.uint8).tobytes()
                   if rng.random() < 0.5 else blob + bytes(rng.integers(1, 9)))


def _fuzz(n_per_blob: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    pages, streams = _valid_blobs()
    for blob in pages:
        _check_page(blob)
        for m in _mutations(blob, rng, n_per_blob):
            _check_page(m)
    for blob in streams:
        _check_stream(blob)
        for m in _mutations(blob, rng, n_per_blob):
            _check_stream(m)


def test_fuzz_corrupt_blobs():
    _fuzz(500, seed=0)  # 3500 blobs


def test_fuzz_detects_stream_damage():
    """Bit flips in a coded body are mostly detected (96.6% over 10k flips; the rest reach the
    unchecked payload bytes of the final states)."""
    p = random_page("c4g64", "outlier", 64, 128, seed=9)
    blob = encode_cold_page(p)
    assert blob[3] & K.F_CODED
    rng = np.random.default_rng(1)
    detected = 0
    for _ in range(300):
        m = bytearray(blob)
        i = int(rng.integers(K.SLOT_HEADER, len(m)))
        m[i] ^= 1 << int(rng.integers(0, 8))
        try:
            decode_cold_page(bytes(m))
        except CorruptSlotError:
            detected += 1
    assert detected >= 270


def test_huge_claims_refused_before_allocation():
    """A short coded blob claiming a huge page or stream is refused from its header."""
    blob = bytearray(encode_cold_page(random_page("c4g64", "outlier", 64, 64, seed=2)))
    assert blob[3] & K.F_CODED
    blob[4:8] = (65535).to_bytes(2, "little") + (65472).to_bytes(2, "little")  # 65535 x 65472 page
    with pytest.raises(CorruptSlotError):
        decode_cold_page(bytes(blob))
    s = bytearray(rans_encode(_symbols(1, 5000, 16, 0.3), 16))
    assert s[3] & K.S_CODED
    s[4:8] = (2**32 - 1).to_bytes(4, "little")
    with pytest.raises(CorruptSlotError):
        rans_decode(bytes(s))


def test_steps_per_word_bound_holds_for_constant_data():
    """The most probable pair (255/256)^2 gives the most steps per word: the bound holds."""
    s = np.zeros(200_000, np.uint8)
    s[0] = 1  # one rare symbol so the dominant one gets 255
    blob = rans_encode(s, 16)
    words = int.from_bytes(blob[8:12], "little")
    assert (s.size + 1) // 2 <= K.STEPS_PER_WORD * (words + K.LANES) + K.TAIL
    assert np.array_equal(rans_decode(blob), s)


@pytest.mark.slow
def test_fuzz_corrupt_blobs_slow():
    _fuzz(15000, seed=1)  # 105k blobs
