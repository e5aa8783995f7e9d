"""GPU sampling (numba_kernels/sampling.py): kernel == numpy spec; spec == the host Sampler's rules.

Runs on the GPU when there is one, else in Numba's CUDA simulator (small vocabularies, 8 threads).
"""
import numpy as np
import pytest
from numba import cuda

from coldkv.numba_kernels import sampling as K
from coldkv.runtime.sampling import Sampler, SamplingParams

S = cuda.default_stream()
CASES = [(0.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (1.3, 0, 0.9), (0.8, 20, 0.75), (2.0, 1, 1.0), (1.0, 0, 0.01)]


def _kernel(logits, temperature, top_k, top_p, seed, step, threads=8):
    params = cuda.to_device(np.array([temperature, top_k, top_p], np.float32))
    state = cuda.to_device(np.array([seed, step], np.int64))
    out = cuda.device_array(1, np.int32)
    K.launch_sample(cuda.to_device(np.ascontiguousarray(logits, np.float32)), params, state, out, S, threads)
    S.synchronize()
    return int(out.copy_to_host()[0]), state.copy_to_host()


@pytest.mark.parametrize("case", CASES)
def test_kernel_equals_reference(case):
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(100) * 3).astype(np.float32)
    logits[[10, 70]] = logits.max() + 1  # a tie at the top: greedy takes the first
    for step in (0, 2**33 + 5) if case == CASES[-1] else (3,):
        tok, state = _kernel(logits, *case, seed=11, step=step)
        assert tok == K.sample_ref(logits, *case, seed=11, step=step)
        assert state.tolist() == [11, step + 1]


def test_kernel_handles_nan_and_inf():
    logits = np.array([np.nan, -np.inf, 1.0, np.inf, 3.0, np.nan], np.float32)
    for case in [(0.0, 0, 1.0), (1.0, 0, 1.0), (1.0, 2, 0.5)]:
        assert _kernel(logits, *case, seed=1, step=0)[0] == K.sample_ref(logits, *case, seed=1, step=0) == 3


@pytest.mark.parametrize("case", CASES[1:])
def test_reference_keeps_what_the_host_sampler_keeps(case):
    rng = np.random.default_rng(3)
    for _ in range(20):
        logits = (rng.standard_normal(500) * rng.uniform(0.5, 6)).astype(np.float32)
        _, kept = K.kept_ref(logits, *case)
        host = Sampler(SamplingParams(temperature=case[0], top_k=case[1], top_p=case[2])).probs(logits)
        assert np.array_equal(kept, host > 0)


def test_reference_draws_follow_the_host_distribution():
    """Gumbel-max over hashed uniforms: 6000 draws of a 12-token top-p set, against the host's
    probabilities (chi-square, 11 dof; p < 1e-4 fails)."""
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(40) * 1.5).astype(np.float32)
    case = (0.9, 0, 0.95)
    probs = Sampler(SamplingParams(temperature=case[0], top_p=case[2])).probs(logits)
    n = 6000
    counts = np.bincount([K.sample_ref(logits, *case, seed=2, step=s) for s in range(n)], minlength=40)
    assert np.all(counts[probs == 0] == 0)
    kept = probs > 0
    expected = n * probs[kept]
    chi2 = float(((counts[kept] - expected) ** 2 / expected).sum())
    dof = int(kept.sum()) - 1
    assert chi2 < dof + 6 * np.sqrt(2 * dof) + 10, (chi2, dof)


@pytest.mark.gpu
def test_gpu_large_vocab():
    """A 151936-token vocabulary, 1024 threads: == the reference at several steps."""
    rng = np.random.default_rng(9)
    logits = (rng.standard_normal(151936) * 4).astype(np.float32)
    for case in [(0.0, 0, 1.0), (0.8, 50, 1.0), (1.0, 0, 0.9), (0.7, 40, 0.95)]:
        for step in (0, 7):
            tok, _ = _kernel(logits, *case, seed=123, step=step, threads=1024)
            assert tok == K.sample_ref(logits, *case, seed=123, step=step)
