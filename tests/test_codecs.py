"""KV formats: scalar FP4/FP8/bf16 rounding against ml_dtypes, block codecs, errors, NMSE bounds."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from coldkv.codecs import (
    FORMATS,
    Packed,
    dequantize,
    e2m1_decode,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    quantize,
    requantize,
)
from coldkv.numba_kernels import quant as Q

E4M3 = ml_dtypes.float8_e4m3fn
E2M1 = ml_dtypes.float4_e2m1fn


def oracle_e4m3(x):
    return np.clip(np.asarray(x, np.float32), -448, 448).astype(E4M3).view(np.uint8)


def oracle_e2m1(x):
    return np.clip(np.asarray(x, np.float32), -6, 6).astype(E2M1).view(np.uint8) & 15


def around(values):
    """Every value, every midpoint between neighbours, each +-1 float32 ulp, both signs."""
    v = np.unique(np.asarray(values, np.float64))
    mids = (v[:-1] + v[1:]) / 2  # exact in float32 for these formats
    pts = np.concatenate([v, mids, [v[-1] * 1.5, v[-1] * 1e6]])
    pts = pts[pts < 3.4e38].astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(-np.inf))])
    return np.concatenate([pts, -pts]).astype(np.float32)


# ------------------------------------------------------------------------------ E4M3
def test_e4m3_every_boundary_matches_ml_dtypes():
    positives = np.arange(0, 0x7F, dtype=np.uint8).view(E4M3).astype(np.float32)
    x = around(positives)
    np.testing.assert_array_equal(e4m3_encode(x), oracle_e4m3(x))


def test_e4m3_random_and_subnormals_match_ml_dtypes():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(300_000) * np.exp2(rng.uniform(-14, 10, 300_000))).astype(np.float32)
    sub = rng.uniform(-2.0**-6, 2.0**-6, 50_000).astype(np.float32)  # E4M3 subnormal range
    tiny = np.array([0.0, -0.0, 1e-45, -1e-45, 2.0**-10, 2.0**-11, 1.5 * 2.0**-10], np.float32)
    for v in (x, sub, tiny):
        np.testing.assert_array_equal(e4m3_encode(v), oracle_e4m3(v))


def test_e4m3_saturates_and_decodes():
    assert e4m3_encode(np.array([475.0, 1e30, np.inf], np.float32)).tolist() == [0x7E] * 3
    assert e4m3_encode(np.array([-475.0, -np.inf], np.float32)).tolist() == [0xFE] * 2
    b = np.arange(256, dtype=np.uint8)
    dec = e4m3_decode(b)
    ref = b.view(E4M3).astype(np.float32)
    nan = np.isnan(ref)
    assert nan.sum() == 2 and np.isnan(dec[nan]).all()
    np.testing.assert_array_equal(dec[~nan].view(np.uint32), ref[~nan].view(np.uint32))


def test_e4m3_nan_is_an_error():
    with pytest.raises(ValueError, match="NaN"):
        e4m3_encode(np.array([1.0, np.nan], np.float32))


# ------------------------------------------------------------------------------ E2M1
def test_e2m1_every_boundary_matches_ml_dtypes():
    x = around([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    np.testing.assert_array_equal(e2m1_encode(x), oracle_e2m1(x))


def test_e2m1_random_matches_ml_dtypes_and_saturates():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(200_000) * 3).astype(np.float32)
    np.testing.assert_array_equal(e2m1_encode(x), oracle_e2m1(x))
    assert e2m1_encode(np.array([6.5, 1e9, np.inf, -7, -np.inf], np.float32)).tolist() == [7, 7, 7, 15, 15]
    assert e2m1_encode(np.array([0.0, -0.0, -0.1], np.float32)).tolist() == [0, 8, 8]


def test_e2m1_decode_all_codes():
    c = np.arange(16, dtype=np.uint8)
    ref = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
    np.testing.assert_array_equal(e2m1_decode(c).view(np.uint32), ref.view(np.uint32))
    with pytest.raises(ValueError):
        e2m1_decode(np.array([16]))
    with pytest.raises(ValueError):
        e2m1_decode(np.array([1.0]))


def test_bf16_matches_ml_dtypes():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(100_000) * np.exp2(rng.uniform(-130, 120, 100_000))).astype(np.float32)
    x = np.concatenate([x, around([1, 1 + 2**-7, 2, 3.0e38]), [np.inf, -np.inf, 0, -0.0]]).astype(np.float32)
    np.testing.assert_array_equal(Q.ref_bf16_encode(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    fin = x[np.isfinite(x)][: (np.isfinite(x).sum() // 2) * 2].reshape(-1, 2)
    p = quantize(fin, "bf16")
    np.testing.assert_array_equal(p.codes, fin.astype(ml_dtypes.bfloat16).view(np.uint16))
    np.testing.assert_array_equal(dequantize(p), fin.astype(ml_dtypes.bfloat16).astype(np.float32))


# ------------------------------------------------------------------------------ blocks
FMTS = list(FORMATS)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_packed_layout_and_nbytes(fmt, head_dim):
    x = np.random.default_rng(3).standard_normal((64, head_dim)).astype(np.float32)
    p = quantize(x, fmt)
    cc = head_dim // 2 if fmt in ("nvfp4", "iso3", "c4g64") else head_dim
    assert p.codes.shape == (64, cc) and p.head_dim == head_dim and p.fmt == fmt
    bits = {"bf16": 16, "int8": 8 + 32 / head_dim, "nvfp4": 4.5, "iso3": 4.5, "c4g64": 4.125}[fmt]
    extra = 4 if FORMATS[fmt][4] else 0
    assert p.nbytes == 64 * head_dim * bits / 8 + extra
    y = dequantize(p)
    assert y.dtype == np.float32 and y.shape == x.shape


def test_low_nibble_holds_even_element():
    x = np.zeros((1, 16), np.float32)
    x[0, 0], x[0, 1] = 6.0, -1.0  # with g from amax 6: codes 7 and 0b1010
    p = quantize(x, "nvfp4")
    assert p.codes[0, 0] == 0x7 | (0xA << 4)
    np.testing.assert_array_equal(dequantize(p)[0, :2], [6.0, -1.0])


def test_spec_by_hand_nvfp4():
    # g = 2688 / 12 = 224; block 0 max 12 -> scale byte e4m3(224*12/6 = 448) = 0x7E
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [12.0, 6.0, 3.0, 1.0]
    x[0, 16] = 0.75  # block 1: scale e4m3(224*.75/6 = 28) = 28 exactly, r = 8, 0.75 -> 6
    p = quantize(x, "nvfp4")
    assert p.global_scale == 224.0
    assert p.scales.tolist() == [[0x7E, e4m3_encode(np.float32(28.0)).item()]]
    np.testing.assert_array_equal(dequantize(p)[0, :4], [12, 6, 3, 1])
    assert dequantize(p)[0, 16] == 0.75


def test_iso3_levels():
    x = (np.arange(16, dtype=np.float32) - 7.5)[None, :]  # one block, max 7.5
    p = quantize(x, "iso3")
    y = dequantize(p)[0]
    step = y[-1] / 7  # 7 levels per sign
    assert np.allclose(np.abs(y) / step, np.round(np.abs(y) / step))
    assert np.abs(y - x[0]).max() <= step / 2 * 1.0001 + 7.5 * 2**-4  # RNE + E4M3 scale rounding


def test_int8_symmetric_per_token():
    x = np.array([[1.0, -2.0, 0.5, 0.0], [0, 0, 0, 0]], np.float32)
    p = quantize(x, "int8")
    assert p.scales.shape == (2,) and p.scales.dtype == np.float32
    assert p.codes[0].tolist() == [64, -127, 32, 0] and p.codes[1].tolist() == [0, 0, 0, 0]
    assert np.abs(dequantize(p) - x).max() <= 2 / 127 / 2


def test_zero_block_and_tiny_values():
    for fmt in FMTS:
        z = np.zeros((3, 64), np.float32)
        assert (dequantize(quantize(z, fmt)) == 0).all()
    x = np.full((1, 64), 1e-30, np.float32)
    x[0, 0] = 1.0  # g = 2688: blocks of 1e-30 have a zero E4M3 scale and decode to 0
    y = dequantize(quantize(x, "nvfp4"))
    assert y[0, 0] == 1.0 and (y[0, 16:] == 0).all()


def test_global_scale_passed_in_and_saturation():
    x = np.array([[1.0] * 15 + [4.0]], np.float32)
    p = quantize(x, "nvfp4", global_scale=2688 / 2.0)  # calibrated amax 2: 4 saturates to 2
    y = dequantize(p)
    assert y[0, -1] == 2.0 and p.global_scale == 1344.0
    assert Q.global_scale_for(0.0) == 1.0 and Q.global_scale_for(np.inf) == 1.0
    assert Q.global_scale_for(1e-38) == 1.0  # 2688 / 1e-38 overflows


def test_requantize_is_dequantize_then_quantize():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, 128)).astype(np.float32)
    for fmt in FMTS:
        p = quantize(x, fmt)
        r = requantize(p, "c4g64")
        assert r.fmt == "c4g64" and r.scales.shape == (64, 2)
        assert r.equal(quantize(dequantize(p), "c4g64"))
        c, s, g = Q.ref_requantize(p.codes, p.scales.reshape(64, -1), Q.FORMAT_IDS[fmt],
                                   np.float32(p.global_scale), 128)
        assert np.array_equal(c, r.codes) and np.array_equal(s, r.scales) and g == np.float32(r.global_scale)


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "x, fmt, kw, match",
    [
        (np.zeros((4, 64), np.float32), "fp8", {}, "unknown KV format"),
        (np.zeros((4, 64, 1), np.float32), "nvfp4", {}, "shape"),
        (np.zeros(64, np.float32), "int8", {}, "shape"),
        (np.zeros((4, 40), np.float32), "nvfp4", {}, "multiple of 16"),
        (np.zeros((4, 96), np.float32), "c4g64", {}, "multiple of 64"),
        (np.zeros((4, 64), np.int32), "nvfp4", {}, "floating-point"),
        (np.full((4, 64), np.nan, np.float32), "bf16", {}, "NaN"),
        (np.full((4, 64), np.inf, np.float32), "nvfp4", {}, "inf"),
        (np.zeros((4, 64), np.float32), "nvfp4", {"global_scale": 0.0}, "global_scale"),
        (np.zeros((4, 64), np.float32), "int8", {"global_scale": 2.0}, "second-level"),
    ],
)
def test_bad_input_is_a_value_error(x, fmt, kw, match):
    with pytest.raises(ValueError, match=match):
        quantize(x, fmt, **kw)


def test_bad_packed_is_a_value_error():
    p = quantize(np.zeros((2, 64), np.float32), "nvfp4")
    bad = Packed("nvfp4", p.codes[:, :8], p.scales, p.global_scale, 64)
    with pytest.raises(ValueError, match="codes"):
        dequantize(bad)
    with pytest.raises(ValueError):
        dequantize("not packed")
    with pytest.raises(ValueError, match="unknown"):
        requantize(p, "fp3")


# ------------------------------------------------------------------------------ NMSE
def data(kind: str, tokens: int = 2048, head_dim: int = 128) -> np.ndarray:
    rng = np.random.default_rng(7)
    if kind == "gaussian":
        return rng.standard_normal((tokens, head_dim)).astype(np.float32)
    if kind == "laplace":
        return rng.laplace(size=(tokens, head_dim)).astype(np.float32)
    x = rng.standard_normal((tokens, head_dim)).astype(np.float32)
    x[:, [3, 40, 77, 101]] *= 20  # a few outlier channels, as real K has
    return x


def nmse(y, x):
    return float(((y - x) ** 2).sum() / (x**2).sum())


def cold(x, fmt):
    """Hot `fmt` (one global per head), then each 64-token page requantized to c4g64."""
    hot = quantize(x, fmt)
    g = hot.global_scale if FORMATS[fmt][4] else None
    pages = [requantize(quantize(x[i:i + 64], fmt, g)) for i in range(0, len(x), 64)]
    return np.concatenate([dequantize(p) for p in pages])


# Upper bounds ~15% above the values measured (docs/formats.md has the numbers).
HOT_BOUNDS = {
    "gaussian": {"int8": 5e-5, "nvfp4": 0.0105, "iso3": 0.0087, "c4g64": 0.013},
    "laplace": {"int8": 1e-4, "nvfp4": 0.010, "iso3": 0.012, "c4g64": 0.0147},
    "outlier": {"int8": 4.5e-4, "nvfp4": 0.0093, "iso3": 0.0171, "c4g64": 0.0293},
}


@pytest.mark.parametrize("kind", list(HOT_BOUNDS))
def test_nmse_hot(kind):
    x = data(kind)
    assert nmse(dequantize(quantize(x, "bf16")), x) < 1e-5
    for fmt, bound in HOT_BOUNDS[kind].items():
        e = nmse(dequantize(quantize(x, fmt)), x)
        assert e < bound, (kind, fmt, e)
    if kind == "gaussian":  # the figure the brief gives for nvfp4
        assert 0.008 < nmse(dequantize(quantize(x, "nvfp4")), x) < 0.010


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
def test_nmse_cold_requant_envelope(kind):
    x = data(kind)
    for src in ("bf16", "int8"):  # the seed's envelope for requantized int8 layers: 0.014
        e = nmse(cold(x, src), x)
        assert e < 0.014, (kind, src, e)
        if kind == "gaussian":
            assert 0.010 < e < 0.0125  # the brief: c4g64 from int8 ~0.011
    # 4-bit hot pages requantized again stack two errors (measured ~0.018-0.023): documented
    assert nmse(cold(x, "nvfp4"), x) < 0.021
    assert nmse(cold(x, "iso3"), x) < 0.027


@pytest.mark.parametrize("fmt", FMTS)
def test_empty_block(fmt):
    p = quantize(np.zeros((0, 64), np.float32), fmt)
    assert dequantize(p).shape == (0, 64)
    assert requantize(p).fmt == "c4g64"
