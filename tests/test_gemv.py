"""The decode GEMVs (numba_kernels/gemv.py) against their numpy reference.

Runs on the GPU when there is one, else in Numba's CUDA simulator (small shapes)."""
import numpy as np
import pytest
from numba import cuda

from coldkv.numba_kernels import gemv as G
from coldkv.numba_kernels import layers as L

S = cuda.default_stream()
PROLOGUES = {"norm": G.NORM, "swiglu": G.SWIGLU, "none": G.NONE}
EPILOGUES = {"out16": G.OUT16, "acc": G.ACC, "store": G.STORE}


def _case(prologue, epilogue, N, K, f16, seed):
    """Run the kernel on random inputs; -> (got float64 [N], reference float64 [N], bound [N])."""
    rng = np.random.default_rng(seed)
    w16 = L.ref_encode16(rng.standard_normal((N, K)) * 0.05, f16)
    norm_w = (1 + 0.1 * rng.standard_normal(K)).astype(np.float32)
    if prologue == G.NORM:
        src = (rng.standard_normal(K) * 3).astype(np.float32)
    elif prologue == G.SWIGLU:
        src = L.ref_encode16(rng.standard_normal(2 * K) * 2, f16)
    else:
        src = L.ref_encode16(rng.standard_normal(K), f16)
    y0 = rng.standard_normal(N).astype(np.float32)
    y = cuda.to_device(np.zeros(N, np.uint16) if epilogue == G.OUT16 else y0)
    G.launch_gemv(cuda.to_device(src), cuda.to_device(w16), y, S, prologue=prologue, epilogue=epilogue,
                  norm_w=cuda.to_device(norm_w), eps=1e-6, f16=f16)
    got = y.copy_to_host()
    got = L.ref_decode16(got, f16).astype(np.float64) if epilogue == G.OUT16 else got.astype(np.float64)

    a = L.ref_decode16(G.gemv_input16(src, prologue=prologue, norm_w=norm_w, eps=1e-6, f16=f16), f16).astype(np.float64)
    wf = L.ref_decode16(w16, f16).astype(np.float64)
    ref = wf @ a + (y0 if epilogue == G.ACC else 0)
    bound = G.gemv_bound(wf, a, ref, prologue=prologue, epilogue=epilogue, f16=f16)
    spec = G.gemv_ref(src, w16, prologue=prologue, epilogue=epilogue, norm_w=norm_w, eps=1e-6,
                      y=y0, f16=f16)
    spec = L.ref_decode16(spec, f16) if epilogue == G.OUT16 else spec
    np.testing.assert_allclose(spec, ref, rtol=0, atol=float(np.max(bound)))  # the spec is the sum above
    return got, ref, bound


# the fused pairs the CUDA backend would run, each epilogue and prologue at least once; the other
# pairs and 16-bit types under -m slow (the simulator takes ~6 s a case)
_RUN = [("norm", "out16", False), ("swiglu", "acc", False), ("none", "acc", True), ("none", "store", False)]
_SLOW = [(p, e, f) for p in PROLOGUES for e in EPILOGUES for f in (False, True) if (p, e, f) not in _RUN]


@pytest.mark.parametrize("pro, epi, f16", _RUN + [pytest.param(*c, marks=pytest.mark.slow) for c in _SLOW])
def test_gemv_matches_reference(pro, epi, f16):
    """N = 21: the second block's second warp has rows past N, its last two warps none; K / 2 = 65
    words: two loads a lane, the second for lane 0 only (the unrolled loop's guard)."""
    got, ref, bound = _case(PROLOGUES[pro], EPILOGUES[epi], 21, 130, f16, seed=len(pro) + 7 * len(epi))
    assert np.all(np.abs(got - ref) <= bound), np.max(np.abs(got - ref) - bound)


def test_gemv_one_output_row_only_from_its_weights():
    """A zero matrix but for one row: every other output is exactly 0 (no row read for another)."""
    N, K = 21, 70
    w = np.zeros((N, K), np.uint16)
    w[13] = L.ref_encode16(np.linspace(-1, 1, K))
    a = L.ref_encode16(np.linspace(0.5, 2, K))
    y = cuda.to_device(np.full(N, 7.0, np.float32))
    G.launch_gemv(cuda.to_device(a), cuda.to_device(w), y, S, prologue=G.NONE, epilogue=G.STORE)
    out = y.copy_to_host()
    assert np.all(out[np.arange(N) != 13] == 0)
    np.testing.assert_allclose(out[13], L.ref_decode16(w[13]).astype(np.float64) @ L.ref_decode16(a), rtol=1e-5)


def test_gemv_refuses_shapes_it_cannot_hold():
    w = cuda.device_array((4, G.MAX_K + 2), np.uint16)
    with pytest.raises(ValueError, match="K even and at most"):
        G.launch_gemv(cuda.device_array(G.MAX_K + 2, np.uint16), w, cuda.device_array(4, np.float32), S,
                      prologue=G.NONE, epilogue=G.STORE)
    with pytest.raises(ValueError, match="uint16 exactly with OUT16"):
        G.launch_gemv(cuda.device_array(8, np.uint16), cuda.device_array((4, 8), np.uint16),
                      cuda.device_array(4, np.float32), S, prologue=G.NONE, epilogue=G.OUT16)


@pytest.mark.gpu
@pytest.mark.parametrize("pro, epi, N, K", [("norm", "out16", 6144, 4096), ("none", "acc", 4096, 4096),
                                            ("swiglu", "acc", 4096, 12288), ("norm", "out16", 1024, 384)])
def test_gpu_gemv_model_shapes(pro, epi, N, K):
    """An 8B model's QKV, o_proj and down shapes, and the bundled model's QKV."""
    got, ref, bound = _case(PROLOGUES[pro], EPILOGUES[epi], N, K, False, seed=N + K)
    assert np.all(np.abs(got - ref) <= bound)
