"""Quantize-append, page dequantize and requantize kernels: njit CPU and CUDA == numpy reference.

Without a GPU the CUDA kernels run under the simulator on small shapes (conftest). `gpu` tests
compare the device with the reference bit for bit on large shapes.
"""
from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import cuda, njit

from coldkv.numba_kernels import fp, ptx
from coldkv.numba_kernels import quant as Q
from coldkv.numba_kernels import requant as RQ

FMTS = list(Q.FORMAT_IDS.values())


def setup(fmt, T=70, H=2, D=128, P=64, pos0=5, seed=0, scale=1.0):
    """x [T, H, D], a shuffled block table [H, max_pages], a pool and per-head global scales."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((T, H, D)) * scale).astype(np.float32)
    x[:, :, 3] *= 9  # an outlier channel
    n_lp = (pos0 + T + P - 1) // P
    table = rng.permutation(H * n_lp).astype(np.int32).reshape(H, n_lp)
    codes, scales = Q.pool_arrays(fmt, H * n_lp, P, D)
    g = np.array([Q.global_scale_for(np.abs(x[:, h]).max() * 1.25) for h in range(H)], np.float32)
    return x, table, codes, scales, g


def expected_pool(fmt, x, pos0, table, codes, scales, g):
    """The reference applied token by token: what the pool must hold after the append."""
    codes, scales = codes.copy(), scales.copy()
    T, H, D = x.shape
    P = codes.shape[1]
    for t in range(T):
        for h in range(H):
            c, s = Q.ref_quantize(x[t, h][None], fmt, g[h])
            page, row = table[h, (pos0 + t) // P], (pos0 + t) % P
            codes[page, row], scales[page, row] = c[0], s[0]
    return codes, scales


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


# ------------------------------------------------------------------------------ scalar cores
@njit
def _cores(v, b8, h16, out):
    for i in range(v.size):
        out[0, i] = fp.e4m3_enc(v[i])
        out[1, i] = fp.e2m1_enc(v[i])
        out[2, i] = fp.bf16_enc(v[i])
    for i in range(b8.size):
        out[3, i] = fp.f32_bits(fp.e4m3_dec(b8[i]))
        out[4, i] = fp.f32_bits(fp.e2m1_dec(b8[i] & 15))
    for i in range(h16.size):
        out[5, i] = fp.f32_bits(fp.bf16_dec(h16[i]))
        out[7, i] = fp.f32_bits(fp.f16_dec(h16[i]))
    for i in range(v.size):
        out[6, i] = fp.f16_enc(v[i])


def test_scalar_cores_njit_and_python_match_reference():
    rng = np.random.default_rng(1)
    v = np.concatenate([
        (rng.standard_normal(20000) * np.exp2(rng.uniform(-16, 10, 20000))),
        Q.ref_e4m3_decode(np.arange(127, dtype=np.uint8)),  # every E4M3 value
        [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 448.0, 464.0, 1e30, -0.0, 0.0],
        # fp16's edges: the largest half, the tie above it, the smallest normal / subnormal and
        # their halves, every half value itself (exact)
        [65504.0, 65520.0, 65519.996, 65536.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -26],
        np.arange(0, 0x7C00, 3, dtype=np.uint16).view(np.float16).astype(np.float32),
    ]).astype(np.float32)
    v = np.concatenate([v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(-np.inf)), -v])
    v = v[np.isfinite(v)].astype(np.float32)
    b8 = np.arange(256, dtype=np.uint8)
    h16 = np.arange(0, 65536, 7, dtype=np.uint16)
    out = np.zeros((8, v.size), np.int64)
    _cores(v, b8, h16, out)
    np.testing.assert_array_equal(out[0], Q.ref_e4m3_encode(v))
    np.testing.assert_array_equal(out[1], Q.ref_e2m1_encode(np.clip(v, -6, 6)))
    np.testing.assert_array_equal(out[2], Q.ref_bf16_encode(v))
    e4 = Q.ref_e4m3_decode(b8)
    ok = ~np.isnan(e4)
    np.testing.assert_array_equal(out[3, :256][ok], bits(e4)[ok])
    assert np.isnan(out[3, :256][~ok].astype(np.uint32).view(np.float32)).all()
    np.testing.assert_array_equal(out[4, :256], bits(Q.ref_e2m1_decode(b8 & 15)))
    np.testing.assert_array_equal(out[5, :h16.size], bits(Q.ref_bf16_decode(h16)))
    # fp16 against numpy's own conversions (RNE, overflow to inf, subnormals)
    with np.errstate(over="ignore"):  # overflow to inf is what is being checked
        np.testing.assert_array_equal(out[6], v.astype(np.float16).view(np.uint16))
    f16 = h16.view(np.float16).astype(np.float32)
    ok = ~np.isnan(f16)
    np.testing.assert_array_equal(out[7, :h16.size][ok], bits(f16)[ok])
    assert np.isnan(out[7, :h16.size][~ok].astype(np.uint32).view(np.float32)).all()
    special = np.array([np.nan, -np.nan, np.inf, -np.inf], np.float32)
    assert [fp.f16_enc(x) for x in special] == list(special.astype(np.float16).view(np.uint16))
    # the same cores as plain Python (what the CUDA simulator runs)
    for i in range(0, v.size, 97):
        assert fp.e4m3_enc(v[i]) == out[0, i] and fp.e2m1_enc(v[i]) == out[1, i]
        assert fp.bf16_enc(v[i]) == out[2, i] and fp.f16_enc(v[i]) == out[6, i]


# ------------------------------------------------------------------------------ njit CPU
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("D", [64, 128, 256])
def test_append_cpu_matches_reference(fmt, D):
    x, table, codes, scales, g = setup(fmt, D=D, pos0=5 if D != 64 else 64)
    pos0 = 5 if D != 64 else 64  # mid-page and page-aligned starts
    want_c, want_s = expected_pool(fmt, x, pos0, table, codes, scales, g)
    Q.append_cpu(fmt, x, pos0, table, codes, scales, g)
    np.testing.assert_array_equal(codes, want_c)
    np.testing.assert_array_equal(scales, want_s)


@pytest.mark.parametrize("fmt", FMTS)
def test_dequant_rows_cpu_matches_reference(fmt):
    x, table, codes, scales, g = setup(fmt, seed=2)
    Q.append_cpu(fmt, x, 5, table, codes, scales, g)
    page = table[1, 0]
    out = np.full((40, 128), np.nan, np.float32)
    Q.dequant_rows_cpu(fmt, codes, scales, page, 10, 50, g[1], out)
    ref = Q.ref_dequantize(codes[page], scales[page], fmt, g[1], 128)[10:50]
    np.testing.assert_array_equal(bits(out), bits(ref))


@pytest.mark.parametrize("fmt", FMTS)
def test_requant_cpu_matches_reference(fmt):
    x, table, codes, scales, g = setup(fmt, seed=3, scale=3.0)
    Q.append_cpu(fmt, x, 5, table, codes, scales, g)
    pages = table[:, 0].copy()
    gsrc = g.copy()
    oc, os_ = Q.pool_arrays("c4g64", 2, 64, 128)
    og = np.zeros(2, np.float32)
    Q.requant_c4g64_cpu(fmt, codes, scales, pages, gsrc, oc, os_, og)
    for i in range(2):
        c, s, g2 = Q.ref_requantize(codes[pages[i]], scales[pages[i]], fmt, gsrc[i], 128)
        np.testing.assert_array_equal(oc[i], c)
        np.testing.assert_array_equal(os_[i], s)
        assert bits(np.float32(og[i])) == bits(np.float32(g2))


def test_append_cpu_unallocated_page_raises():
    x, table, codes, scales, g = setup(2, T=2)
    table[:] = -1
    with pytest.raises(ValueError, match="unallocated"):
        Q.append_cpu(2, x, 0, table, codes, scales, g)


@pytest.mark.parametrize("fmt", FMTS)
def test_nonfinite_input_poisons_its_group(fmt):
    x, table, codes, scales, g = setup(fmt, T=1, pos0=0)
    x[0, 0, 20] = np.nan
    x[0, 1, 70] = np.inf
    Q.append_cpu(fmt, x, 0, table, codes, scales, g)
    for h, col in ((0, 20), (1, 70)):
        out = np.zeros((1, 128), np.float32)
        Q.dequant_rows_cpu(fmt, codes, scales, table[h, 0], 0, 1, g[h], out)
        if fmt == 0:  # bf16 keeps the value
            assert (np.isnan(out[0, col]) if h == 0 else np.isinf(out[0, col]))
            assert np.isfinite(np.delete(out[0], col)).all()
            continue
        grp = {1: 128, 2: 16, 3: 16, 4: 64}[fmt]
        lo = col // grp * grp
        assert np.isnan(out[0, lo:lo + grp]).all()
        assert np.isfinite(np.delete(out[0], np.arange(lo, lo + grp))).all()


# ------------------------------------------------------------------------------ CUDA (simulator
# without a GPU: tiny shapes; real device when present)
def sim_setup(fmt, D=64):
    return setup(fmt, T=3, H=2, D=D, P=4, pos0=3, seed=5)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("D", [64, 128])
def test_append_cuda_matches_reference(fmt, D):
    x, table, codes, scales, g = sim_setup(fmt, D)
    x[1, 0, 17] = np.nan  # a poisoned group must be poisoned the same way

    want_c, want_s = expected_pool(fmt, x, 3, table, codes, scales, g)
    Q.launch_append(fmt, x, 3, table, codes, scales, g)
    np.testing.assert_array_equal(codes, want_c)
    np.testing.assert_array_equal(scales, want_s)


@pytest.mark.parametrize("fmt", FMTS)
def test_dequant_pages_cuda_matches_reference(fmt):
    x, table, codes, scales, g = sim_setup(fmt)
    Q.append_cpu(fmt, x, 3, table, codes, scales, g)
    pages = np.array([table[1, 1], table[0, 0]], np.int32)
    gs = g[[1, 0]].copy()
    out = np.zeros((2, 4, 64), np.float32)
    Q.launch_dequant_pages(fmt, codes, scales, pages, gs, out)
    for i in range(2):
        ref = Q.ref_dequantize(codes[pages[i]], scales[pages[i]], fmt, gs[i], 64)
        np.testing.assert_array_equal(bits(out[i]), bits(ref))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("D", [64, 128])
def test_requant_cuda_matches_reference(fmt, D):
    x, table, codes, scales, g = sim_setup(fmt, D)
    Q.append_cpu(fmt, x, 3, table, codes, scales, g)
    pages = np.array([table[0, 1], table[1, 0]], np.int32)
    if fmt in (Q.NVFP4, Q.ISO3, Q.C4G64):  # groups without their top code: the general pass 1
        codes[pages[0], 1, :8] &= 0x66
        codes[pages[1], 2] &= 0x55
    gsrc = g.copy()
    oc, os_ = Q.pool_arrays("c4g64", 2, 4, D)
    og = np.zeros(2, np.float32)
    RQ.launch_requant_c4g64(fmt, codes, scales, pages, gsrc, oc, os_, og)
    for i in range(2):
        c, s, g2 = Q.ref_requantize(codes[pages[i]], scales[pages[i]], fmt, gsrc[i], D)
        np.testing.assert_array_equal(oc[i], c)
        np.testing.assert_array_equal(os_[i], s)
        assert bits(np.float32(og[i])) == bits(np.float32(g2))


@cuda.jit
def _decode_kernel(fmt, codes, scales, page, g, out_v, out_c):
    """Exercise the device functions attention will call: one value, and a 16-value chunk."""
    t = cuda.threadIdx.x
    for col in range(out_v.shape[1]):
        out_v[t, col] = Q.decode_value(fmt, codes, scales, page, t, col, g)
    buf = cuda.local.array(16, np.float32)
    for c0 in range(0, out_c.shape[1], 16):
        Q.dequantize_chunk(fmt, codes, scales, page, t, c0, 16, g, buf, 0)
        for k in range(16):
            out_c[t, c0 + k] = buf[k]


@pytest.mark.parametrize("fmt", FMTS)
def test_device_decode_functions(fmt):
    x, table, codes, scales, g = sim_setup(fmt)
    Q.append_cpu(fmt, x, 3, table, codes, scales, g)
    page = int(table[0, 1])
    v = np.zeros((4, 64), np.float32)
    c = np.zeros((4, 64), np.float32)
    _decode_kernel[1, 4](fmt, codes, scales, page, g[0], v, c)
    ref = Q.ref_dequantize(codes[page], scales[page], fmt, g[0], 64)
    np.testing.assert_array_equal(bits(v), bits(ref))
    np.testing.assert_array_equal(bits(c), bits(ref))


# ------------------------------------------------------------------------------ GPU, large
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("D", [64, 128, 256])
def test_gpu_large_bit_identical(fmt, D):
    T, H, P = 4096, 8, 64
    x, table, codes, scales, g = setup(fmt, T=T, H=H, D=D, P=P, pos0=0, seed=11, scale=2.0)
    want_c, want_s = codes.copy(), scales.copy()
    Q.append_cpu(fmt, x, 0, table, want_c, want_s, g)
    # the CPU kernel is checked against the reference above; spot-check it again on this shape
    rc, rs = Q.ref_quantize(x[:P, 0], fmt, g[0])
    assert np.array_equal(want_c[table[0, 0]], rc) and np.array_equal(want_s[table[0, 0]], rs)
    d_codes, d_scales = cuda.to_device(codes), cuda.to_device(scales)
    Q.launch_append(fmt, cuda.to_device(x), 0, cuda.to_device(table), d_codes, d_scales, cuda.to_device(g))
    np.testing.assert_array_equal(d_codes.copy_to_host(), want_c)
    np.testing.assert_array_equal(d_scales.copy_to_host(), want_s)
    n = codes.shape[0]
    pages = np.random.default_rng(0).permutation(n).astype(np.int32)
    gs = np.full(n, g[0], np.float32)
    out = cuda.device_array((n, P, D), np.float32)
    Q.launch_dequant_pages(fmt, d_codes, d_scales, cuda.to_device(pages), cuda.to_device(gs), out)
    got = out.copy_to_host()
    for i in range(0, n, 37):
        ref = Q.ref_dequantize(want_c[pages[i]], want_s[pages[i]], fmt, gs[i], D)
        np.testing.assert_array_equal(bits(got[i]), bits(ref))
    oc, os_ = Q.pool_arrays("c4g64", n, P, D)
    og = np.zeros(n, np.float32)
    Q.requant_c4g64_cpu(fmt, want_c, want_s, pages, gs, oc, os_, og)
    d_oc, d_os, d_og = cuda.to_device(np.zeros_like(oc)), cuda.to_device(np.zeros_like(os_)), cuda.device_array(n, np.float32)
    RQ.launch_requant_c4g64(fmt, d_codes, d_scales, cuda.to_device(pages), cuda.to_device(gs), d_oc, d_os, d_og)
    np.testing.assert_array_equal(d_oc.copy_to_host(), oc)
    np.testing.assert_array_equal(d_os.copy_to_host(), os_)
    np.testing.assert_array_equal(bits(d_og.copy_to_host()), bits(og))


# ------------------------------------------------------------------------------ CUDA layout edges
# The CUDA kernels give a lane 8 consecutive values of a 256-value chunk and use shifts when the
# head count / page size are powers of two: cover partial chunks, D = 256 / 512 (a chunk is one or
# half a row), non-power-of-two heads and page sizes, and poisoned groups on every path.
@njit
def _e2m1_bits_mismatches(lo, hi, sign):
    bad = 0
    for b in range(lo, hi):
        v = np.uint32(b | sign).view(np.float32)
        if Q.e2m1_enc_bits(v) != fp.e2m1_enc(v):
            bad += 1
    return bad


def test_e2m1_enc_bits_matches_scalar_core():
    """The CUDA kernels' bit-trick E2M1 encoder == fp.e2m1_enc on every float32 with |v| <= 8."""
    for sign in (0, 0x80000000):
        assert _e2m1_bits_mismatches(0, 0x41000001, sign) == 0
    v = np.float32([1e30, 7.0, 6.5, 6.0000005, 3.4e38, 1e-45, -1e-45]).astype(np.float32)
    assert [Q.e2m1_enc_bits(a) for a in v] == [fp.e2m1_enc(a) for a in v]


def _mag_probe_values():
    """E2M1 decision boundaries and grid points (and 4 ulps around each), scaled by the
    multipliers e2m1_mag_bits_x is used with, plus random magnitudes, zeros, subnormals, huge."""
    pts = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0])
    b = pts.view(np.uint32).astype(np.int64)
    near = (b[:, None] + np.arange(-4, 5)[None, :]).reshape(-1).astype(np.uint32).view(np.float32)
    rng = np.random.default_rng(5)
    rnd = (rng.random(3000) * 9).astype(np.float32)
    return np.concatenate([near, rnd, np.float32([0.0, 1e-45, 1e-39, 1e30, 3.4e38, np.inf])])


def test_e2m1_mag_bits_matches_reference():
    """The saturating-float E2M1 encoder (its simulator emulation here; the device asm is
    checked exhaustively by test_gpu_e2m1_mag_bits_exhaustive) == ml_dtypes-checked ref magnitudes,
    for y and for 2 c y (e2m1_mag_bits_x, c a power of two)."""
    if not numba.config.ENABLE_CUDASIM:
        pytest.skip("device functions are called from Python under the simulator only")
    y = _mag_probe_values()
    for c in (0.5, 0.25, 1.0, 2.0):
        for sign in (1, -1):
            v = (np.float32(sign) * y).astype(np.float32)
            want = Q.ref_e2m1_encode((v.astype(np.float64) * 2 * c).astype(np.float32)) & 7
            got = np.array([int(Q.e2m1_mag_bits_x(a, np.float32(c))) - 0x4B000000 for a in v])
            np.testing.assert_array_equal(got, want, err_msg=f"c={c}")
    assert int(Q.e2m1_mag_bits(np.float32(np.nan))) == 0x4B000000  # NaN -> 0 (callers avoid it)


def _table32(a, b):
    """The 4-bit requant table bytes from the reference E2M1 encoder: lo = (0, E(a/2), E(a), E(b)),
    hi = (E(2a), E(2b), E(4a), E(4b)) (products in float64: exact scalings of float32)."""
    def e(x, k):
        return int(Q.ref_e2m1_encode(np.float32([abs(float(x)) * k]))[0]) & 7
    lo = (e(a, 0.5) << 8) | (e(a, 1) << 16) | (e(b, 1) << 24)
    hi = e(a, 2) | (e(b, 2) << 8) | (e(a, 4) << 16) | (e(b, 4) << 24)
    return lo, hi


def test_e2m1_table16_matches_reference():
    """The f16x2 round-to-odd table (its simulator emulation; the device asm is checked
    exhaustively against the fp32 encoder by test_gpu_e2m1_table16_exhaustive) == reference E2M1
    magnitudes of a/2 .. 4b, at every decision boundary +-4 ulps of each scaling, near fp16
    rounding points, and on random, tiny and huge values."""
    if not numba.config.ENABLE_CUDASIM:
        pytest.skip("device functions are called from Python under the simulator only")
    y = _mag_probe_values()
    vals = np.concatenate([y * np.float32(k) for k in (0.5, 1.0, 2.0, 4.0)] + [y / np.float32(2.0)])
    vals = np.concatenate([vals, (np.float32(1) + np.arange(-8, 9) * np.float32(2.0 ** -23)) * np.float32(0.125),
                           np.float32([65504.0, 65520.0, 1e5, 2.0 ** -14, 2.0 ** -25])]).astype(np.float32)
    rng = np.random.default_rng(7)
    for a in vals:
        b = -vals[rng.integers(len(vals))]
        assert tuple(int(v) for v in Q.e2m1_table16(a, b)) == _table32(a, b), (a, b)


def _iso3_table32(d, r):
    """The iso3 requant table from the reference E2M1 encoder on the reference's own products
    fl(fl(m d) r), m = 1..7 (byte m of lo:hi, byte 0 = 0)."""
    t = 0
    for m in range(1, 8):
        y = np.float32(np.float32(np.float32(m) * np.float32(d)) * np.float32(r))
        t |= (int(Q.ref_e2m1_encode(np.float32([y]))[0]) & 7) << (8 * m)
    return t & 0xFFFFFFFF, t >> 32


def _iso3_table16q(d, r):
    d, r = np.float32(d), np.float32(r)
    return tuple(int(v) for v in Q.iso3_table16q(d * r, (d * np.float32(3)) * r, (d * np.float32(5)) * r,
                                                  (d * np.float32(7)) * r))


def test_iso3_table16q_matches_reference():
    """The iso3 fast-page table (four products, doublings for m = 2, 4, 6; simulator emulation,
    the asm checked by test_gpu_iso3_table16q_exhaustive) == the reference encoder on fl(fl(m d) r) for every m:
    products on each decision boundary +-4 ulps, random steps and multipliers over the fast
    page's range (d in [2^-119, 2^119], r = g2 / s finite), zeros."""
    if not numba.config.ENABLE_CUDASIM:
        pytest.skip("device functions are called from Python under the simulator only")
    rng = np.random.default_rng(11)
    pairs = [(0.0, 1.0), (1.0, 0.0), (2.0 ** -119, 2.0 ** -109), (2.0 ** 119, 2.0 ** 109), (2.0 ** 119, 1.0)]
    for y in _mag_probe_values()[:135]:  # boundaries and grid points +-4 ulps: land m d r on them
        for m in (1, 3, 5, 7):
            r = np.float32(rng.uniform(0.5, 8.0))
            pairs.append((np.float32(y) / np.float32(m) / r, r))
            pairs.append((np.float32(y) / np.float32(2 * m) / r, r))
    for _ in range(3000):
        pairs.append((np.float32(2.0 ** rng.uniform(-20, 10)), np.float32(2.0 ** rng.uniform(-10, 20))))
    for d, r in pairs:
        assert _iso3_table16q(d, r) == _iso3_table32(d, r), (d, r)


def test_simd_lane_emulations():
    """The simulator's u16x2/s16x2 max/min and PRMT (with its sign-replicate selectors), from the
    PTX definitions."""
    if not numba.config.ENABLE_CUDASIM:
        pytest.skip("device functions are called from Python under the simulator only")
    assert Q.max_u16x2(0x8001FFFF, 0x7FFF0001) == 0x8001FFFF
    assert Q.max_s16x2(0x8001FFFF, 0x7FFF0001) == 0x7FFF0001
    assert Q.min_s16x2(0x8001FFFF, 0x7FFF0001) == 0x8001FFFF
    w = np.uint32(0x80FF7F01)  # int8 codes 1, 127, -1, -128
    assert ptx.prmt(w, 0, 0xA280) == 0xFFFF0001  # bytes 0, 2 sign-extended: 1, -1
    assert ptx.prmt(w, 0, 0xB391) == 0xFF80007F  # bytes 1, 3: 127, -128


@cuda.jit
def _mag_mismatch_kernel(lo, n, c, bad):
    i = cuda.grid(1)
    st = cuda.gridsize(1)
    for k in range(i, n, st):
        v = Q.bits_f32(np.uint32(lo + k))
        for sgn in (np.float32(1.0), np.float32(-1.0)):
            y = sgn * v
            want = Q.e2m1_enc_bits(y * np.float32(2.0 * c)) & 7
            if np.int64(Q.e2m1_mag_bits_x(y, np.float32(c))) - 0x4B000000 != want:
                cuda.atomic.add(bad, 0, 1)


@pytest.mark.gpu
def test_gpu_e2m1_mag_bits_exhaustive():
    """The device asm encoder == e2m1_enc_bits (itself exhaustively == the scalar core) on every
    float32 with |y| <= 16, for each multiplier the kernels use."""
    hi = int(np.float32(16.0).view(np.uint32)) + 1
    for c in (0.5, 0.25, 1.0, 2.0):
        bad = cuda.to_device(np.zeros(1, np.int64))
        _mag_mismatch_kernel[4096, 256](0, hi, c, bad)
        assert bad.copy_to_host()[0] == 0, c


@cuda.jit
def _e4m3_mismatch_kernel(lo, n, bad):
    i = cuda.grid(1)
    for k in range(i, n, cuda.gridsize(1)):
        v = Q.bits_f32(np.uint32(lo + k))
        if Q.e4m3_sat_bits(v) & np.uint32(0xFF) != fp.e4m3_enc(min(v, fp.E4M3_MAX)):
            cuda.atomic.add(bad, 0, 1)
    if i < 256:
        a = Q.e4m3_f32(np.uint32(i))
        b = fp.e4m3_dec(np.int64(i))
        if not (a == b or (a != a and b != b)):
            cuda.atomic.add(bad, 1, 1)


@pytest.mark.gpu
def test_gpu_e4m3_conversions():
    """The hardware E4M3 conversions of the requant kernel == the scalar cores: the encoder on every
    float32 from 0 to 2^10 (every rounding of the normal and subnormal E4M3 range, saturation),
    plus inf; the decoder on all 256 bytes."""
    hi = int(np.float32(1024.0).view(np.uint32)) + 1
    bad = cuda.to_device(np.zeros(2, np.int64))
    _e4m3_mismatch_kernel[4096, 256](0, hi, bad)
    _e4m3_mismatch_kernel[1, 1](int(np.float32(np.inf).view(np.uint32)), 1, bad)
    assert list(bad.copy_to_host()) == [0, 0]


@cuda.jit
def _table16_mismatch_kernel(lo, n, bad):
    i = cuda.grid(1)
    for k in range(i, n, cuda.gridsize(1)):
        a = Q.bits_f32(np.uint32(lo + k))
        b = -a
        x, y = Q.e2m1_table16(a, b)
        want_x = ((Q.e2m1_mag_bits_x(a, np.float32(0.25)) & 7) << 8) | ((Q.e2m1_mag_bits_x(a, np.float32(0.5)) & 7) << 16) \
            | ((Q.e2m1_mag_bits_x(b, np.float32(0.5)) & 7) << 24)
        want_y = (Q.e2m1_mag_bits_x(a, np.float32(1.0)) & 7) | ((Q.e2m1_mag_bits_x(b, np.float32(1.0)) & 7) << 8) \
            | ((Q.e2m1_mag_bits_x(a, np.float32(2.0)) & 7) << 16) | ((Q.e2m1_mag_bits_x(b, np.float32(2.0)) & 7) << 24)
        if x != want_x or y != want_y:
            cuda.atomic.add(bad, 0, 1)


@pytest.mark.gpu
def test_gpu_e2m1_table16_exhaustive():
    """The f16x2 round-to-odd table == the fp32 encoder (itself exhaustively checked) on every
    float32 a in [0, 64] (past that every entry is 7), in both halves (b = -a), plus inf."""
    hi = int(np.float32(64.0).view(np.uint32)) + 1
    bad = cuda.to_device(np.zeros(1, np.int64))
    _table16_mismatch_kernel[8192, 256](0, hi, bad)
    _table16_mismatch_kernel[1, 1](int(np.float32(np.inf).view(np.uint32)), 1, bad)
    assert bad.copy_to_host()[0] == 0


@cuda.jit
def _iso3_table_mismatch_kernel(lo, n, bad):
    i = cuda.grid(1)
    for k in range(i, n, cuda.gridsize(1)):
        x = Q.bits_f32(np.uint32(lo + k))
        a, b = Q.iso3_table16q(x, x, x, x)
        e1 = Q.e2m1_mag_bits_x(x, np.float32(0.5)) & 7
        e2 = Q.e2m1_mag_bits_x(x, np.float32(1.0)) & 7
        e4 = Q.e2m1_mag_bits_x(x, np.float32(2.0)) & 7
        if a != (e1 << 8) | (e2 << 16) | (e1 << 24) or b != e4 | (e1 << 8) | (e2 << 16) | (e1 << 24):
            cuda.atomic.add(bad, 0, 1)


@pytest.mark.gpu
def test_gpu_iso3_table16q_exhaustive():
    """The iso3 table asm == the fp32 encoder (itself exhaustively checked) in every slot on every
    float32 in [0, 64] (past that every entry is 7), plus inf. Each slot is computed from its own
    product alone, so equal products check them all; the doubling argument that picks the
    products is test_iso3_table16q_matches_reference's."""
    hi = int(np.float32(64.0).view(np.uint32)) + 1
    bad = cuda.to_device(np.zeros(1, np.int64))
    _iso3_table_mismatch_kernel[8192, 256](0, hi, bad)
    _iso3_table_mismatch_kernel[1, 1](int(np.float32(np.inf).view(np.uint32)), 1, bad)
    assert bad.copy_to_host()[0] == 0


def test_bit_decoders_match_scalar_cores():
    for c in range(16):
        assert bits(np.float32(Q.e2m1_dec_bits(c))) == bits(np.float32(fp.e2m1_dec(c)))
        assert bits(np.float32(Q.iso3_dec_bits(c))) == bits(np.float32(fp.iso3_dec(c)))


def test_table_decoder_and_swar_max_match_scalar_cores():
    """_dec4 (PRMT byte tables, 4 codes per word) == the bit decoders on every 16-bit word, and the
    SWAR largest-magnitude search == a plain max over 16 nibbles."""
    if not numba.config.ENABLE_CUDASIM:
        pytest.skip("device functions are called from Python under the simulator only")
    for f, dec in ((Q.NVFP4, Q.e2m1_dec_bits), (Q.ISO3, Q.iso3_dec_bits)):
        t3, t2 = Q._DEC_T3[f], Q._DEC_T2[f]
        for w in range(65536):
            got = Q._dec4(t3[0], t3[1], t2[0], t2[1], np.uint32(w))
            want = [dec((w >> (4 * i)) & 15) for i in range(4)]
            assert [bits(np.float32(a)) for a in got] == [bits(np.float32(a)) for a in want], (f, w)
    rng = np.random.default_rng(2)
    words = rng.integers(0, 2**32, (4000, 2), dtype=np.uint64)
    words[:1000] &= 0x33333333  # small magnitudes only
    words[1000:1500] = 0
    for w0, w1 in words:
        want = max(((int(w) >> (4 * i)) & 7) for w in (w0, w1) for i in range(8))
        assert RQ._max_mag16(np.uint32(w0), np.uint32(w1)) == want


ODD = [(3, 3, 64, 3, 2), (2, 1, 256, 4, 1), (1, 2, 512, 2, 0)]  # (T, H, D, P, pos0)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("shape", ODD)
def test_append_cuda_odd_shapes(fmt, shape):
    T, H, D, P, pos0 = shape
    x, table, codes, scales, g = setup(fmt, T=T, H=H, D=D, P=P, pos0=pos0, seed=7)
    x[0, H - 1, D - 1] = np.nan
    x[T - 1, 0, 40] = -np.inf
    want_c, want_s = expected_pool(fmt, x, pos0, table, codes, scales, g)
    Q.launch_append(fmt, x, pos0, table, codes, scales, g)
    np.testing.assert_array_equal(codes, want_c)
    np.testing.assert_array_equal(scales, want_s)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("shape", ODD)
def test_dequant_requant_cuda_odd_shapes(fmt, shape):
    T, H, D, P, pos0 = shape
    x, table, codes, scales, g = setup(fmt, T=T, H=H, D=D, P=P, pos0=pos0, seed=8, scale=2.0)
    x[0, 0, 5] = np.nan  # a poisoned group (row for int8, value for bf16) in page table[0, 0]
    Q.append_cpu(fmt, x, pos0, table, codes, scales, g)
    pages = table.reshape(-1).astype(np.int32)
    gs = np.repeat(g, table.shape[1]).astype(np.float32)
    out = np.zeros((pages.size, P, D), np.float32)
    Q.launch_dequant_pages(fmt, codes, scales, pages, gs, out)
    oc, os_ = Q.pool_arrays("c4g64", pages.size, P, D)
    og = np.zeros(pages.size, np.float32)
    RQ.launch_requant_c4g64(fmt, codes, scales, pages, gs, oc, os_, og)
    for i in range(pages.size):
        ref = Q.ref_dequantize(codes[pages[i]], scales[pages[i]], fmt, gs[i], D)
        np.testing.assert_array_equal(bits(out[i]), bits(ref))
        c, s, g2 = Q.ref_requantize(codes[pages[i]], scales[pages[i]], fmt, gs[i], D)
        np.testing.assert_array_equal(oc[i], c)
        np.testing.assert_array_equal(os_[i], s)
        assert bits(np.float32(og[i])) == bits(np.float32(g2))


def test_requant_cuda_int8_ties_at_every_decision_point():
    """int8 -> c4g64 encodes by thresholds on |code| (requant._i8_word). Rows built so that the value
    times the output multiplier lands exactly on every E2M1 decision point (ties to the even code:
    0.25 -> 0, 0.75 -> 1.0, ...), their neighbours +-1 code, a -128 code (the exact fallback) and
    random rows: == the reference, and the test checks that the ties really occur."""
    rng = np.random.default_rng(11)
    P, D = 8, 64
    codes, scales = Q.pool_arrays("int8", 1, P, D)
    # g2 = 2688 / 42 = 64 (row 0 holds the page max 64 * 0.65625); a row with scale s and max code m
    # gets the output step 64 m s / 6 (exact E4M3 here) and value * r = 6 c / m
    rows = [(0.65625, 64), (0.5, 24), (0.25, 48), (1.0, 12)]
    for t, (sc, m) in enumerate(rows):
        ties = [c for c in range(1, m + 1) if np.float32(6 * c / m) in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)]
        vals = sorted({m, *ties, *(c - 1 for c in ties), *(c + 1 for c in ties if c < m)})
        vals = (vals + [-v for v in vals] + list(rng.integers(-m, m + 1, D)))[:D]
        codes[0, t] = np.array(vals, np.int8)
        scales[0, t] = sc
    codes[0, 4] = rng.integers(-100, 101, D)
    codes[0, 4, 9] = -128
    scales[0, 4] = 0.01
    codes[0, 5:] = rng.integers(-127, 128, (3, D))
    scales[0, 5:, 0] = np.float32([0.3, 1e-3, 0.07])
    pages, gsrc = np.zeros(1, np.int32), np.ones(1, np.float32)
    oc, os_ = Q.pool_arrays("c4g64", 1, P, D)
    og = np.zeros(1, np.float32)
    RQ.launch_requant_c4g64(Q.INT8, codes, scales, pages, gsrc, oc, os_, og)
    c, s2, g2 = Q.ref_requantize(codes[0], scales[0], Q.INT8, 1.0, D)
    assert g2 == np.float32(64.0)
    y = np.abs(Q.ref_dequantize(codes[0], scales[0], Q.INT8, 1.0, D)[:4] * (g2 / Q.ref_e4m3_decode(s2[:4])))
    assert set(np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])) <= set(y.ravel())
    np.testing.assert_array_equal(oc[0], c)
    np.testing.assert_array_equal(os_[0], s2)
    assert bits(np.float32(og[0])) == bits(g2)


@pytest.mark.skipif(not numba.config.ENABLE_CUDASIM, reason="calls a device function from Python (simulator)")
def test_int8_thresholds_from_a_perturbed_estimate():
    """Each threshold is picked from the estimate ceil(b / (s r)) and its two neighbours by exact
    evaluation, so an estimate off by a few ulps either way (rcp.approx) still gives the least
    |code| whose E2M1 magnitude reaches k; checked against brute force over |code| 0..128."""
    rng = np.random.default_rng(12)
    B = [(np.float32(b), k % 2 == 0) for k, b in enumerate(RQ._I8_B)]  # (b_k, strict) for k = 1..7
    c = np.arange(129, dtype=np.float32)
    for _ in range(300):
        s = np.float32(rng.choice([2.0 ** rng.integers(-8, 3), rng.uniform(1e-3, 2)]))
        r = np.float32(rng.choice([2.0 ** rng.integers(-4, 4), rng.uniform(0.01, 4)]))
        y = (c * s) * r
        for rel in (1 - 2.0 ** -21, 1.0, 1 + 2.0 ** -21):
            inv = np.float32(np.float32(1.0) / (s * r) * rel)
            for b, strict in B:
                meets = (y > b) if strict else (y >= b)
                want = min(int(np.argmax(meets)) if meets.any() else 128, 128)
                q = np.float32(1.0 if strict else -1.0)
                got = (int(RQ._i8_threshold(s, r, inv, b, q)) + 0x80) & 0xFF  # stored minus 0x80
                assert got == want, (s, r, rel, b)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("gmul", [-1.0, 1e-37])
def test_requant_cuda_unusual_source_globals(fmt, gmul):
    """Negative steps (the code-table sign rule) and steps so large that products overflow to inf
    (the non-finite fallbacks): still == the reference."""
    x, table, codes, scales, g = sim_setup(fmt)
    x[0, 0, 9] = np.nan
    Q.append_cpu(fmt, x, 3, table, codes, scales, g)
    pages = table.reshape(-1).astype(np.int32)
    gsrc = np.repeat(g * np.float32(gmul), table.shape[1]).astype(np.float32)
    oc, os_ = Q.pool_arrays("c4g64", pages.size, 4, 64)
    og = np.zeros(pages.size, np.float32)
    RQ.launch_requant_c4g64(fmt, codes, scales, pages, gsrc, oc, os_, og)
    for i in range(pages.size):
        with np.errstate(over="ignore", invalid="ignore"):
            c, s, g2 = Q.ref_requantize(codes[pages[i]], scales[pages[i]], fmt, gsrc[i], 64)
        np.testing.assert_array_equal(oc[i], c)
        np.testing.assert_array_equal(os_[i], s)
        assert bits(np.float32(og[i])) == bits(np.float32(g2))


def _requant_check(fmt, T, H, D, P, seed):
    x, table, codes, scales, g = setup(fmt, T=T, H=H, D=D, P=P, pos0=0, seed=seed, scale=2.0)
    x[1, 0, 7] = np.inf  # a poisoned group in page table[0, 0]
    Q.append_cpu(fmt, x, 0, table, codes, scales, g)
    pages = table.reshape(-1).astype(np.int32)
    gs = np.repeat(g, table.shape[1]).astype(np.float32)
    oc, os_ = Q.pool_arrays("c4g64", pages.size, P, D)
    og = np.zeros(pages.size, np.float32)
    RQ.launch_requant_c4g64(fmt, codes, scales, pages, gs, oc, os_, og)
    for i in range(pages.size):
        c, s, g2 = Q.ref_requantize(codes[pages[i]], scales[pages[i]], fmt, gs[i], D)
        np.testing.assert_array_equal(oc[i], c)
        np.testing.assert_array_equal(os_[i], s)
        assert bits(np.float32(og[i])) == bits(np.float32(g2))


@pytest.mark.parametrize("fmt", [f for f in FMTS if f != Q.BF16])
def test_requant_cuda_rereads_units_past_registers(fmt, monkeypatch):
    """Requant runs a warp per page (bf16: its own kernel, below); a lane keeps _RQ_KEEP[fmt]
    units in registers and reads the rest again in pass 2. Rebuilt with one kept unit, an 8 x 512
    page (64 units, 2 per lane) takes that path."""
    monkeypatch.setitem(RQ._RQ_KEEP, fmt, 1)
    monkeypatch.setitem(RQ.requant_c4g64_cuda, fmt, RQ._make_requant(fmt))
    _requant_check(fmt, T=16, H=1, D=512, P=8, seed=3)


def test_requant_cuda_bf16_two_halves_a_thread():
    """bf16 runs a block of 256 threads per page, half a unit a thread; a 32 x 512 page (256
    units, 512 halves) gives every thread a second half-unit, read in both passes."""
    _requant_check(Q.BF16, T=32, H=1, D=512, P=32, seed=6)


@pytest.mark.parametrize("fmt", FMTS)
def test_requant_cuda_one_block_walks_all_pages(fmt, monkeypatch):
    """A grid smaller than the page list: each warp takes several pages in turn (its step table
    rewritten per page between two syncwarps)."""
    monkeypatch.setattr(Q, "_MAX_BLOCKS", 1)
    _requant_check(fmt, T=12, H=2, D=64, P=4, seed=4)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_requant_large_pages(fmt):
    """Pages of 256 x 256 values: 1024 units, 2 per thread of a 512-thread block."""
    _requant_check(fmt, T=512, H=2, D=256, P=256, seed=4)


def test_launchers_refuse_strided_arrays():
    """The kernels move rows in 16-byte vectors: a strided last axis must be refused, not misread."""
    x, table, codes, scales, g = sim_setup(Q.NVFP4)
    wide = np.repeat(x, 2, axis=2)[:, :, ::2]  # same values, last-axis stride 8 B
    with pytest.raises(ValueError, match="contiguous"):
        Q.launch_append(Q.NVFP4, wide, 3, table, codes, scales, g)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("shape", [(64, 1, 128, 64), (48, 1, 128, 48)])
def test_requant_cuda_kept_units_fast_loop(fmt, shape):
    """Pages of 128 and 96 units: 4 and 3 kept units per lane (the fast loop's unit pairs, the
    odd last pair)."""
    T, H, D, P = shape
    _requant_check(fmt, T=T, H=H, D=D, P=P, seed=5)


@cuda.jit
def _fast_requant_asm_kernel(lo, n, stride, bad):
    """The fast page's asm against the IEEE / reference forms: e2m1_table16q == e2m1_table16 and
    fdiv6(x) == x / 6 on every x in [lo, lo + n) with a normal quotient and its scale byte on every one;
    e4m3_sat_byte == e4m3_sat_bits & 0xFF
    there too; fdivp(g, s) == g / s for g = bits(0x0D800000 + stride k) (2^-100 .. 2^100) and
    every positive finite E4M3 s."""
    i = cuda.grid(1)
    for k in range(i, n, cuda.gridsize(1)):
        x = Q.bits_f32(np.uint32(lo + k))
        if Q.e2m1_table16q(x, x) != Q.e2m1_table16(x, x):
            cuda.atomic.add(bad, 0, 1)
        # fdiv6 is div.rn's fast path, exact where its FCHK passes: normal quotients (x >= 2^-123);
        # below that only the scale byte it feeds matters (0 either way)
        if x >= np.float32(2.0 ** -123) and Q.f32_bits(Q.fdiv6(x)) != Q.f32_bits(x / np.float32(6.0)):
            cuda.atomic.add(bad, 1, 1)
        if Q.e4m3_sat_byte(Q.fdiv6(x)) != (Q.e4m3_sat_bits(x / np.float32(6.0)) & np.uint32(0xFF)):
            cuda.atomic.add(bad, 4, 1)
        if Q.e4m3_sat_byte(x) != (Q.e4m3_sat_bits(x) & np.uint32(0xFF)):
            cuda.atomic.add(bad, 2, 1)
        if k % 16:  # fdivp on every 16th numerator (2^26 of them over the range): seconds, not minutes
            continue
        g = Q.bits_f32(np.uint32(0x0D800000 + ((k * stride) % (0x71800000 - 0x0D800000))))
        for b in range(1, 127):
            s = Q.e4m3_f32(b)
            if Q.f32_bits(Q.fdivp(g, s)) != Q.f32_bits(g / s):
                cuda.atomic.add(bad, 3, 1)


@pytest.mark.gpu
def test_gpu_fast_requant_asm():
    """Every float32 in [0, 4096] (table inputs past 64 are all 7s; g2 gm <= 2688 (1 + 2^-23)),
    plus huge table inputs; fdivp over 2^26 numerators spread across [2^-100, 2^100]."""
    hi = int(np.float32(4096.0).view(np.uint32)) + 1
    bad = cuda.to_device(np.zeros(5, np.int64))
    _fast_requant_asm_kernel[8192, 256](0, hi, 7, bad)
    for v in (65504.0, 65520.0, 1e6, 1e30, 3.4e38):
        _fast_requant_asm_kernel[1, 1](int(np.float32(v).view(np.uint32)), 1, 1, bad)
    assert list(bad.copy_to_host()) == [0, 0, 0, 0, 0]
