"""The CUDA forward-pass kernels (numba_kernels/layers.py) against their numpy references.

Runs on the GPU when there is one, else in Numba's CUDA simulator (small shapes)."""
import numpy as np
import pytest
from numba import cuda

from coldkv.numba_kernels import layers as L
from coldkv.numba_kernels.fp import global_scale_for
from coldkv.numba_kernels.quant import FORMAT_IDS, append_cpu, pool_arrays

S = cuda.default_stream()
rng = np.random.default_rng(0)


def _close16(got_bits, ref_bits, f16=False):
    """Within one rounding step of the 16-bit type (bf16 8 significant bits, fp16 11): the kernel
    sums in float32, the reference in float64, so a value on a rounding boundary may go either way;
    everything else must be identical. Below the type's normal range the step is absolute (fp16
    subnormals: 2^-24; a swiglu of 8M random values makes some)."""
    got, ref = L.ref_decode16(got_bits, f16), L.ref_decode16(ref_bits, f16)
    assert np.all(np.abs(got - ref) <= np.abs(ref) * (2.0**-10 if f16 else 2.0**-7) + (2.0**-24 if f16 else 2.0**-133))
    assert np.mean(got_bits == ref_bits) > 0.97


F16 = pytest.mark.parametrize("f16", [False, True], ids=["bf16", "fp16"])  # the checkpoint's 16-bit type


@F16
@pytest.mark.parametrize("dim", [96, 1100])  # 1100: a thread's 4 values a step over 3 steps, the last partial
def test_embed_exact(dim, f16):
    table = rng.integers(0, 2**16, (50, dim)).astype(np.uint16)
    table[(table & (0x7C00 if f16 else 0x7F80)) == (0x7C00 if f16 else 0x7F80)] = 0  # no NaN/inf bit patterns
    tokens = np.array([3, 49, 0, 3], np.int32)
    x = cuda.device_array((4, dim), np.float32)
    L.launch_embed(cuda.to_device(tokens), cuda.to_device(table), x, S, f16=f16)
    np.testing.assert_array_equal(x.copy_to_host(), L.embed_ref(tokens, table, f16))


@F16
@pytest.mark.parametrize("T, n", [(5, 200), (3, 384), (5, 1000), (2, 5000)])
def test_rms_norm(T, n, f16):
    """Rows held by one warp (n 200 / 384: 7 and 12 values a lane), by two warps (1000) and by 512
    threads (5000), their sums of squares met in shared memory; T not a multiple of a block's rows."""
    assert [L.rms_norm_shape(k)[0] for k in (200, 384, 1000, 5000)] == [32, 32, 64, 512]
    x = (rng.standard_normal((T, n)) * 3).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    out = cuda.device_array((T, n), np.uint16)
    L.launch_rms_norm(cuda.to_device(x), cuda.to_device(w), 1e-6, out, S, f16=f16)
    _close16(out.copy_to_host(), L.rms_norm_ref(x, w, 1e-6, f16), f16)


def test_row_kernels_refuse_rows_they_cannot_hold():
    """The kernels refuse; the CUDA backend refuses such a model up front, with the CLI's error type."""
    import coldkv
    from coldkv.errors import PlanError
    from coldkv.runtime.cuda_backend import CUDABackend
    from coldkv.runtime.loader import load_args

    with pytest.raises(ValueError, match="rows of at most 16384"):
        L.rms_norm_shape(16385)
    args = load_args(coldkv.DEFAULT_MODEL).replace(hidden_size=L.MAX_ROW + 64)
    with pytest.raises(PlanError, match="hidden size is 16448; use --device cpu"):
        CUDABackend(coldkv.DEFAULT_MODEL, args=args)
    with pytest.raises(PlanError, match="even MLP width, this model's is 1025"):  # swiglu's two columns a thread
        CUDABackend(coldkv.DEFAULT_MODEL, args=load_args(coldkv.DEFAULT_MODEL).replace(intermediate_size=1025))


@F16
def test_swiglu_and_add_bias(f16):
    gu = L.ref_encode16(rng.standard_normal((3, 2 * 300)) * 4, f16)  # 300: two column blocks, one part
    out = cuda.device_array((3, 300), np.uint16)
    L.launch_swiglu(cuda.to_device(gu), out, S, f16=f16)
    _close16(out.copy_to_host(), L.swiglu_ref(gu, f16), f16)
    y = rng.standard_normal((2, 300)).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    dy = cuda.to_device(y)
    L.launch_add_bias(dy, cuda.to_device(b), S)
    np.testing.assert_array_equal(dy.copy_to_host(), y + b)


@F16
def test_elementwise_kernels_stride_over_rows(f16):
    """Grids smaller than the work: each thread's loop takes ROWS_IN_FLIGHT rows (values) a step,
    over several steps, with a partial last step."""
    T, n = 19, 40  # 2 row blocks x 4 rows a step: 3 steps, the last one partial
    gu = L.ref_encode16(rng.standard_normal((T, 2 * n)) * 4, f16)
    out = cuda.device_array((T, n), np.uint16)
    L.swiglu_kernel(f16)[(1, 2), 64](cuda.to_device(gu).view(np.uint32), out.view(np.uint32))  # (launch_swiglu's views)
    _close16(out.copy_to_host(), L.swiglu_ref(gu, f16), f16)
    y = rng.standard_normal((T, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    dy = cuda.to_device(y)
    L.add_bias_kernel[(1, 2), 64](dy, cuda.to_device(b))
    np.testing.assert_array_equal(dy.copy_to_host(), y + b)


def _rope_tables(n, D):
    from coldkv.runtime.config import RopeArgs
    from coldkv.runtime.rope import Rope

    return Rope(RopeArgs(), D).cos_sin(np.arange(n))


def _check_qkv_rope_append(k_fmt, v_fmt, qk_norm, bias, D, Hq, H, T, P, pos0, f16=False):
    """q/k/v after bias, norm and RoPE match the float64 reference; the pages written by the fused
    path are bit-identical to the CPU codec (append_cpu) run on the kernel's own fp32 K/V, in a pool
    of pages mapped at random to positions pos0 .. pos0 + T - 1 (other table entries unmapped).
    qkv comes as the GEMM writes it: bf16 (fp16 with f16) bits."""
    qkv = L.ref_encode16(rng.standard_normal((T, (Hq + 2 * H) * D)), f16)
    b = rng.standard_normal(qkv.shape[1]).astype(np.float32) if bias else np.zeros(0, np.float32)
    qn, kn = ((1 + 0.1 * rng.standard_normal((2, D))).astype(np.float32) if qk_norm
              else (np.zeros(0, np.float32),) * 2)
    cos, sin = _rope_tables(pos0 + T, D)
    first, last = pos0 // P, (pos0 + T - 1) // P
    used = last - first + 1
    table = np.full((2, H, last + 2), -1, np.int32)
    for plane in range(2):
        table[plane, :, first:last + 1] = rng.permutation(used * H).reshape(H, used)
    gscale = np.array([[global_scale_for(5.0 + 2 * h) for h in range(H)]] * 2, np.float32)
    pools = [pool_arrays(f, used * H, P, D) for f in (k_fmt, v_fmt)]
    dev = lambda a: cuda.to_device(a)  # noqa: E731
    args = [dev(qkv), dev(b), dev(qn), dev(kn), dev(cos), dev(sin), dev(np.array([pos0], np.int32)), 1e-6]
    q = cuda.to_device(np.full((T, Hq, D), np.nan, np.float32))
    kv = cuda.to_device(np.zeros((2, T, H, D), np.float32))
    dpools = [(FORMAT_IDS[f], dev(table[i]), dev(c), dev(s)) for i, (f, (c, s)) in enumerate(zip((k_fmt, v_fmt), pools))]
    L.launch_qkv_rope_append(*args, q, kv, *dpools, dev(gscale), False, S, f16=f16)  # fp32 K/V out
    kv_h = kv.copy_to_host()
    rq, rk, rv = L.qkv_post_ref(qkv, b if bias else None, qn if qk_norm else None, kn if qk_norm else None,
                                cos, sin, pos0, 1e-6, Hq, H, f16)
    assert np.isnan(q.copy_to_host()).all()  # the fp32 pass leaves q to the pages pass
    L.launch_qkv_rope_append(*args, q, kv, *dpools, dev(gscale), True, S, f16=f16)  # quantized into pages
    for got, ref in ((q.copy_to_host(), rq), (kv_h[0], rk), (kv_h[1], rv)):
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
    for plane, (f, (codes, scales)) in enumerate(zip((k_fmt, v_fmt), pools)):
        append_cpu(FORMAT_IDS[f], kv_h[plane], pos0, table[plane], codes, scales, gscale[plane])
        np.testing.assert_array_equal(dpools[plane][2].copy_to_host(), codes)
        np.testing.assert_array_equal(dpools[plane][3].copy_to_host(), scales)


@pytest.mark.parametrize("k_fmt, v_fmt, qk_norm, bias, D, Hq, H, f16", [
    ("nvfp4", "int8", True, False, 64, 4, 2, False), ("iso3", "bf16", False, True, 128, 4, 2, True),
    ("bf16", "nvfp4", True, True, 192, 4, 2, False), ("int8", "iso3", False, False, 256, 4, 2, True),
    ("nvfp4", "nvfp4", True, False, 128, 3, 1, False)])
def test_qkv_rope_append(k_fmt, v_fmt, qk_norm, bias, D, Hq, H, f16):
    """Every head_dim the kernel takes (a kernel per head_dim), both 16-bit input types, and 5 head
    slots: a block of 4 warps with 3 past the last slot; 3 tokens across two pages of 4."""
    _check_qkv_rope_append(k_fmt, v_fmt, qk_norm, bias, D, Hq, H, T=3, P=4, pos0=6, f16=f16)


@pytest.mark.gpu
@pytest.mark.parametrize("k_fmt, v_fmt, qk_norm, bias, D, Hq, H, f16", [
    ("nvfp4", "iso3", True, False, 128, 4, 2, False),  # the bundled model's nvfp4 table
    ("int8", "bf16", False, True, 128, 28, 4, True), ("iso3", "nvfp4", True, False, 256, 24, 4, False)])
def test_gpu_qkv_rope_append_chunk(k_fmt, v_fmt, qk_norm, bias, D, Hq, H, f16):
    """A full prefill chunk on the device: 8192 tokens (4099 for the wide shapes) from position
    1000, pages of 64."""
    T = 8192 if Hq <= 4 else 4099
    _check_qkv_rope_append(k_fmt, v_fmt, qk_norm, bias, D, Hq, H, T=T, P=64, pos0=1000, f16=f16)


@pytest.mark.gpu
@F16
def test_gpu_row_kernels_chunk(f16):
    """The row kernels on the device at a chunk's shapes, with the launchers' strided grids: rms_norm
    over the bundled model's rows (384) and wide ones (4096: 256 threads a row; 5000: 512), swiglu
    over 8192 rows, the calibration over 8192 tokens."""
    for T, n in ((8192, 384), (1000, 4096), (37, 5000)):
        x = (rng.standard_normal((T, n)) * 3).astype(np.float32)
        w = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        out = cuda.device_array((T, n), np.uint16)
        L.launch_rms_norm(cuda.to_device(x), cuda.to_device(w), 1e-6, out, S, f16=f16)
        _close16(out.copy_to_host(), L.rms_norm_ref(x, w, 1e-6, f16), f16)
    gu = L.ref_encode16(rng.standard_normal((8192, 2 * 1024)) * 4, f16)
    out = cuda.device_array((8192, 1024), np.uint16)
    L.launch_swiglu(cuda.to_device(gu), out, S, f16=f16)
    _close16(out.copy_to_host(), L.swiglu_ref(gu, f16), f16)
    kv = rng.standard_normal((2, 8192, 2, 128)).astype(np.float32)
    kv[1, 5000, 1, 17] = 40.0
    g = cuda.device_array((2, 2), np.float32)
    part = cuda.device_array((2, 2, L.GSCALE_SLICES), np.float32)
    L.launch_kv_gscale(cuda.to_device(kv), cuda.to_device(np.array([0, 8000], np.int32)),
                       cuda.to_device(np.array([1, 1], np.int32)), g, part, S)
    want = [[global_scale_for(4.0 * float(np.abs(kv[p, :8000, h]).max())) for h in range(2)] for p in range(2)]
    np.testing.assert_array_equal(g.copy_to_host(), np.array(want, np.float32))


def test_kv_gscale_matches_host_calibration():
    kv = (rng.standard_normal((2, 5, 3, 64)) * np.array([1, 4, 0.01])[:, None]).astype(np.float32)
    T = 4  # a longer scratch than the chunk: rows past T must be ignored
    kv[:, T:] = 1e6
    kv[0, 3, 2, 7] = 50.0  # head 2's max in the second slice
    kv[0, 1, 1, 5] = np.nan  # a non-finite value: g = 1, as global_scale_for(nan) on the host
    g = cuda.to_device(np.zeros((2, 3), np.float32))
    part = cuda.to_device(np.full((2, 3, 3), np.nan, np.float32))  # 3 slices: 2, 2 and 0 rows
    pos = cuda.to_device(np.array([7, T], np.int32))  # (first position, valid rows)
    L.launch_kv_gscale(cuda.to_device(kv), pos, cuda.to_device(np.array([1, 0], np.int32)), g, part, S)
    want = np.ones((2, 3), np.float32)
    want[0] = [global_scale_for(4.0 * float(np.abs(kv[0, :T, h]).max())) for h in range(3)]
    assert want[0, 1] == 1.0 and want[0, 2] == global_scale_for(200.0)
    np.testing.assert_array_equal(g.copy_to_host(), want)
