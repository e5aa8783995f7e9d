"""The CUDA backend's host logic under Numba's CUDA simulator, for machines without a GPU.

What runs as on a GPU: prefill in chunks (padded last chunk, the staging buffers kept and grown
between prompts, events from the ring), decode_steps one step ahead with seeded sampling on the
device, and its undo when the reader stops early; every kernel of the pass is simulated except
cuBLAS and the paged attention (tests/sim_stand_ins.py says why). tests/test_cuda_backend.py runs
the same logic on the GPU (gpu-marked); this file lets a session without one check a change to
it. Slow (~1.5-2.5 min on one core): `pytest -m slow tests/test_cuda_backend_sim.py`.
"""
from __future__ import annotations

import functools

import numba
import numpy as np
import pytest

from sim_stand_ins import ArrayCopy, NumpyGemm, cpu_paged_attention, sync_event
from tinymodel import make_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not numba.config.ENABLE_CUDASIM,
                                                   reason="the simulator's test; on a GPU test_cuda_backend.py runs")]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt"), "qwen3", seed=3, layers=1, head_dim=64, heads=2,
                           kv_heads=1, hidden=64)


@pytest.fixture(scope="module")
def backend(ckpt):
    from numba import cuda

    from coldkv.numba_kernels import sampling
    from coldkv.runtime import cuda_backend as CB

    mp = pytest.MonkeyPatch()
    mp.setattr(CB, "CublasGemm", NumpyGemm)
    mp.setattr(CB, "PinnedCopy", ArrayCopy)
    mp.setattr(CB, "paged_attention_cuda", cpu_paged_attention)
    mp.setattr(CB, "launch_sample", functools.partial(sampling.launch_sample, threads=32))  # same draw, fewer threads
    mp.setattr(CB.L, "GSCALE_SLICES", 4)  # the calibration's 512 slices would be most of the run
    mp.setattr(cuda, "event", sync_event)
    yield CB.CUDABackend(ckpt, graphs=False)
    mp.undo()


def _table(backend, name):
    from coldkv.runtime.kv_table import resolve_table

    return resolve_table(name, backend.args.num_hidden_layers)


def test_prefill_chunks_equal_one_pass(backend):
    """Chunked prefill gives the logits of one forward pass over the prompt: a padded last chunk; a
    second, longer prompt that grows the staging buffers; a cache of exactly the prompt's page, where
    the last chunk's padding does not fit and that chunk runs unpadded; a one-chunk prompt (its ids
    and position copied straight into the pass's buffers)."""
    from coldkv.runtime.kv_cache_cuda import DevicePagedKVCache

    table, a = _table(backend, "int8"), backend.args
    for n, chunk, exact in ((12, 5, False), (20, 8, False), (64, 48, True), (7, 16, False)):
        prompt = np.arange(3, 3 + n) % backend.args.vocab_size
        cache = (DevicePagedKVCache(table, a.num_key_value_heads, a.head_dim, n, backend.page_tokens) if exact
                 else backend.new_cache(table, 40))
        seen = []
        got = backend.prefill(prompt, cache, chunk=chunk, on_progress=seen.append)
        assert cache.length == n and seen == list(range(chunk, n, chunk)) + [n]
        want = backend.forward(prompt, backend.new_cache(table, n))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert len(backend._prompt[0]) == 128  # grown: 12 tokens + padding to 15 ids -> 16, 24 -> 32, 96 -> 128


def test_prefill_pass_buffers_must_fit_free_memory(backend, ckpt, monkeypatch):
    """A --prefill-chunk whose pass buffers pass the GPU's free memory is a PlanError naming the
    option, raised before any buffer is allocated; one that fits gets buffers of its rows."""
    from numba import cuda

    from coldkv.errors import PlanError
    from coldkv.runtime import cuda_backend as CB

    need = CB.chunk_buffer_bytes(backend.args, 4096)
    ctx = type(cuda.current_context())
    monkeypatch.setattr(ctx, "get_memory_info", lambda self: (need - 1, 2 * need))
    with pytest.raises(PlanError, match="--prefill-chunk"):
        CB.CUDABackend(ckpt, graphs=False, prefill_chunk=4096)
    monkeypatch.setattr(ctx, "get_memory_info", lambda self: (need, 2 * need))
    assert CB.CUDABackend(ckpt, graphs=False, prefill_chunk=4096).x.shape[0] == 4096


def test_calibration_takes_the_first_calib_tokens(backend, ckpt, monkeypatch):
    """A layer's 4-bit scales come from its first CALIB_TOKENS tokens however long its first pass
    (a 32768-token pass calibrates on 8192): a 40-token prompt in one pass gets the scales of its
    first 16 tokens alone, and different ones when it calibrates on all 40."""
    from coldkv.runtime import cuda_backend as CB

    table = _table(backend, "nvfp4")
    prompt = (np.arange(40) * 37 + 5) % backend.args.vocab_size
    scales = {}
    for calib in (16, 64):
        monkeypatch.setattr(CB, "CALIB_TOKENS", calib)
        b = CB.CUDABackend(ckpt, graphs=False)
        for n in (16, 40):
            cache = b.new_cache(table, 64)
            b.prefill(prompt[:n], cache, chunk=40)
            scales[calib, n] = cache.gscale_dev.copy_to_host()
    np.testing.assert_array_equal(scales[16, 40], scales[16, 16])
    np.testing.assert_array_equal(scales[64, 16], scales[16, 16])
    assert not np.array_equal(scales[64, 40], scales[16, 16])


def test_decode_steps_closed_early_equal_decode_in_a_loop(backend):
    """Two tokens read of a run-ahead decode_steps, then close: the cache loses the step nobody read
    and the sampler's draw counter steps back, so the next decode() draws what a plain loop draws."""
    from coldkv.runtime.sampling import Sampler, SamplingParams

    params = SamplingParams(temperature=1.5, seed=11)
    prompt = np.arange(5, 15)
    runs = []
    for ahead in (True, False):
        cache = backend.new_cache(_table(backend, "int8"), 40)
        first = int(np.argmax(backend.prefill(prompt, cache, chunk=10)))
        sampler = Sampler(params)
        if ahead:
            steps = backend.decode_steps(first, cache, sampler, 6)
            toks = [next(steps), next(steps)]
            assert cache.length == len(prompt) + 3  # the third step is enqueued before the second is read
            steps.close()
            assert cache.length == len(prompt) + 2
        else:
            toks = [backend.decode(first, cache, sampler)]
            toks.append(backend.decode(toks[-1], cache, sampler))
        toks.append(backend.decode(toks[-1], cache, sampler))
        runs.append((toks, cache.length))
    assert runs[0] == runs[1]
