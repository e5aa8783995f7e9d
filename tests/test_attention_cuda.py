"""CUDA paged GQA attention (decode and chunked causal prefill) == dense reference.

The cache is filled through the formats engineer's quantizer (quant.append_cpu) with a random
block table; the reference (attention.attention_reference, float64) runs on the dense K/V decoded
by quant.ref_dequantize, so the only error measured is the attention arithmetic. The bound is
flash-attention style: a small multiple of the error of the same dense attention computed in
float32, plus a tiny absolute floor. Outputs are poisoned with NaN before each launch; pool pages
and rows the kernel must not read hold NaN-coded values.

Without a GPU the kernels run under the CUDA simulator on small shapes; `gpu` tests use large
shapes and also compare with torch SDPA.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from numba import cuda

from coldkv.numba_kernels import attention_cuda as A
from coldkv.numba_kernels import attention_mma as M
from coldkv.numba_kernels import quant as Q
from coldkv.numba_kernels.attention import attention_reference

FMTS = {"bf16": Q.BF16, "int8": Q.INT8, "nvfp4": Q.NVFP4, "iso3": Q.ISO3}


def _poison_pool(fmt, codes, scales, rng):
    """NaN-coded values everywhere: a read of a page or row never written shows up as NaN."""
    if fmt == Q.BF16:
        codes[...] = 0x7FC0
    elif fmt == Q.INT8:
        codes[...] = rng.integers(-127, 128, codes.shape, dtype=np.int8)
        scales[...] = np.nan
    else:
        codes[...] = rng.integers(0, 256, codes.shape, dtype=np.uint8)
        scales[...] = 0x7F  # E4M3 NaN


def make_cache(kf, vf, L, H, D, P, seed, spare_pages=3):
    """Random K/V [L, H, D] quantized into shuffled pages. Returns (pools, table, gscale, kd, vd)
    with kd/vd the dense decoded K/V (what the kernel must attend over)."""
    rng = np.random.default_rng(seed)
    n_lp = -(-L // P)
    k = rng.standard_normal((L, H, D)).astype(np.float32)
    k[:, :, 5] *= 6  # an outlier channel, as real K has
    v = rng.standard_normal((L, H, D)).astype(np.float32)
    n_pages = H * n_lp + spare_pages
    perm = rng.permutation(n_pages)[: H * n_lp].astype(np.int32)
    tk = perm.reshape(H, n_lp)
    tv = rng.permutation(perm).reshape(H, n_lp).astype(np.int32)
    max_pages = n_lp + 2
    table = np.full((2, H, max_pages), -1, np.int32)
    table[0, :, :n_lp], table[1, :, :n_lp] = tk, tv
    gscale = np.empty((2, H), np.float32)
    pools, dense = [], []
    for plane, (fmt, x) in enumerate([(kf, k), (vf, v)]):
        codes, scales = Q.pool_arrays(fmt, n_pages, P, D)
        _poison_pool(fmt, codes, scales, rng)
        for h in range(H):
            gscale[plane, h] = Q.global_scale_for(np.abs(x[:, h]).max())
        Q.append_cpu(fmt, x, 0, table[plane], codes, scales, gscale[plane])
        xd = np.empty_like(x)
        for h in range(H):
            for lp in range(n_lp):
                pg = table[plane, h, lp]
                rows = Q.ref_dequantize(codes[pg], scales[pg], fmt, gscale[plane, h], D)
                n = min(P, L - lp * P)
                xd[lp * P: lp * P + n, h] = rows[:n]
        pools.append((codes, scales))
        dense.append(xd)
    return pools, table, gscale, dense[0], dense[1]


def dense_attention_f32(q, k, v, pos0, sm_scale):
    """The same attention as attention_reference, in float32 (its error sets the tolerance)."""
    T, Hq, D = q.shape
    L, H, _ = k.shape
    G = Hq // H
    out = np.empty((T, Hq, D), np.float32)
    mask = np.arange(L)[None, :] > (pos0 + np.arange(T))[:, None]
    for hq in range(Hq):
        s = (q[:, hq, :] @ k[:, hq // G, :].T) * np.float32(sm_scale)
        s[mask] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, hq, :] = (p / p.sum(axis=1, keepdims=True)) @ v[:, hq // G, :]
    return out


def _round_bf16(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000  # round to nearest even
    return b.astype(np.uint32).view(np.float32)


def _kernel_kw(kernel):
    """Test names of the kernels -> paged_attention_cuda keywords: "mma" the tensor-core kernels
    as `auto` picks them (rows kernel for T > 1), "mma_i64" the int64-index build, "mma_tok" the
    decode kernel for T > 1 too (one query token per warp, the previous prefill path)."""
    return {"mma_i64": {"kernel": "mma", "mma_u64": False},
            "mma_tok": {"kernel": "mma", "mma_prefill": False},
            # the "fa" prefill kernel (FA2-style shared tiles, the auto default)
            "mma_fa": {"kernel": "mma", "mma_prefill": "fa"},
            "mma_fa8": {"kernel": "mma", "mma_prefill": "fa", "mma_warps": 8},
            # the same on Hopper warpgroup MMAs (sm_90a; emulated under the simulator)
            **{"mma_" + k: {"kernel": "mma", **kw} for k, kw in A.PREFILL_KERNELS.items() if k != "fa"},
            "mma_t4": {"kernel": "mma", "mma_tiles": 4},
            "mma_pipe": {"kernel": "mma", "mma_pipe": True},
            "mma_k8off": {"kernel": "mma", "mma_k8": False},
            # q's fragments in shared memory at 96 registers (5 blocks an SM)
            "mma_qs96": {"kernel": "mma", "mma_qsmem": True, "max_registers": 96},
            # pages read through a shared-memory ring filled by cp.async.bulk
            "mma_bulk": {"kernel": "mma", "mma_bulk": True},
            # the K product with tokens on the MMA rows, P transposed by movmatrix
            "mma_tm": {"kernel": "mma", "mma_tm": True},
            "mma_notm": {"kernel": "mma", "mma_tm": False},  # the 4-bit formats' default is tm at G 4 / 6
            # the split merge as a programmatic dependent launch of the decode kernel
            "mma_pdl": {"kernel": "mma", "mma_pdl": True},
            "mma_tm_bulk": {"kernel": "mma", "mma_tm": True, "mma_bulk": True},
            # the same with 32-token chunks through the ring, at 128 registers (bench's tmbulkt4)
            "mma_tm_t4": {"kernel": "mma", "mma_tm": True, "mma_bulk": True, "mma_tiles": 4,
                          "max_registers": 128},
            # through the ring with q in shared memory at 96 registers (bench's tmqs96)
            "mma_tm_qs96": {"kernel": "mma", "mma_tm": True, "mma_bulk": True, "mma_qsmem": True,
                            "max_registers": 96}}.get(kernel, {"kernel": kernel})


def references(q, kd, vd, pos0, sm, kf, vf, kernel):
    """(ref, ref32, extra bound) for the kernel that `kernel` selects. The tensor-core kernel
    rounds q * sm_scale * log2(e) to fp16 (bf16 against bf16 K) and each p (times the V scale) to
    fp16 (bf16 against bf16 V): the reference uses the same q, and the p rounding adds at most
    eps * (P |V|) to each output (relative rounding of every p; 2x margin)."""
    T, Hq, D = q.shape
    G = Hq // kd.shape[1]
    if not A._use_mma(_kernel_kw(kernel)["kernel"], kf, vf, G, D):
        return attention_reference(q, kd, vd, pos0, sm), dense_attention_f32(q, kd, vd, pos0, sm), 0.0
    qs = np.float32(sm * A._LOG2E)
    kw = _kernel_kw(kernel)
    decode_kernel = kw.get("mma_prefill") is False or (kw.get("mma_prefill") is None and T == 1)
    if decode_kernel and kw.get("mma_k8", True) and M.supports_k8(kf, G, D):
        q16 = M.ref_q_int16(q * qs)
    else:
        q16 = _round_bf16(q * qs) if kf == Q.BF16 else (q * qs).astype(np.float16).astype(np.float32)
    q_eff = (q16.astype(np.float64) / np.float64(qs)).astype(np.float32)
    eps = 2.0 ** -8 if vf == Q.BF16 else 2.0 ** -11
    extra = 2 * eps * attention_reference(q_eff, kd, np.abs(vd), pos0, sm)
    return attention_reference(q_eff, kd, vd, pos0, sm), dense_attention_f32(q_eff, kd, vd, pos0, sm), extra


def run_case(kf, vf, G, D, L, T=1, H=2, P=16, seed=0, ws=None, qscale=1.0, kernel="auto"):
    """Run the CUDA kernel on a fresh random cache of L tokens (query chunk = the last T).
    Returns (output, reference, float32 reference, extra bound)."""
    pools, table, gscale, kd, vd = make_cache(kf, vf, L, H, D, P, seed)
    rng = np.random.default_rng(seed + 1000)
    Hq = G * H
    q = (rng.standard_normal((T, Hq, D)) * qscale).astype(np.float32)
    pos0 = L - T
    sm = 1.0 / math.sqrt(D)
    ws = ws or A.AttentionWorkspace(64, T, Hq, D)
    out = cuda.to_device(np.full((T, Hq, D), np.nan, np.float32))
    (kc, ks), (vc, vs) = pools
    A.paged_attention_cuda(cuda.to_device(q), out, pos0, sm, kf, cuda.to_device(kc), cuda.to_device(ks),
                           vf, cuda.to_device(vc), cuda.to_device(vs), cuda.to_device(gscale),
                           cuda.to_device(table), ws, check_cold=False, **_kernel_kw(kernel))
    got = out.copy_to_host()
    return (got, *references(q, kd, vd, pos0, sm, kf, vf, kernel))


def check(got, ref, ref32, extra=0.0, factor=8.0):
    assert np.isfinite(got).all(), "NaN/inf in output (poisoned read or unwritten output)"
    err32 = np.abs(ref32 - ref).max()
    bound = factor * err32 + 1e-6 * np.abs(ref).max() + extra
    excess = np.abs(got - ref) - bound
    i = np.unravel_index(np.argmax(excess), got.shape)
    assert excess[i] <= 0, (f"err {abs(got[i] - ref[i]):.3g} > bound {np.broadcast_to(bound, got.shape)[i]:.3g} at {i} "
                            f"(max err {np.abs(got - ref).max():.3g}, float32 reference err {err32:.3g})")


# ------------------------------------------------------------------------------ simulator, small
# The simulator runs every thread in Python: these cases take 15-110 s each on 2 cores, so they
# run with -m slow (and, being small, on the GPU too); the default suite keeps one of each kind.
SIM_SLOW = pytest.mark.slow


# Each format once as K and once as V (the default table's nvfp4/iso3 among them) in the default
# suite; all 16 pairs with -m slow (~10 s each in the simulator).
_COVER = {("bf16", "int8"), ("int8", "nvfp4"), ("nvfp4", "iso3"), ("iso3", "bf16")}


@pytest.mark.parametrize("kname, vname", [
    pytest.param(k, v, marks=() if (k, v) in _COVER else SIM_SLOW) for k in FMTS for v in FMTS])
def test_decode_every_format_pair(kname, vname):
    kf, vf = FMTS[kname], FMTS[vname]
    res = run_case(kf, vf, G=4, D=64, L=37, H=1, seed=len(kname) * 10 + len(vname))
    check(*res)


@pytest.mark.parametrize("G,D,fmts", [(1, 64, ("nvfp4", "iso3")), (6, 64, ("int8", "bf16")),
                                      (4, 128, ("iso3", "nvfp4")),
                                      pytest.param(6, 256, ("nvfp4", "int8"), marks=SIM_SLOW),
                                      (1, 256, ("bf16", "nvfp4"))])
def test_decode_gqa_ratios_and_head_dims(G, D, fmts):
    res = run_case(FMTS[fmts[0]], FMTS[fmts[1]], G=G, D=D, L=21, H=1, P=8, seed=G * D)
    check(*res)


@pytest.mark.parametrize("L,P", [(1, 16), (130, 64)] + [pytest.param(L, P, marks=SIM_SLOW) for L, P in
                                                        [(16, 16), (33, 16), (100, 32), (64, 64)]])
def test_decode_context_lengths(L, P):
    res = run_case(Q.NVFP4, Q.INT8, G=4, D=64, L=L, H=1, P=P, seed=L)
    check(*res)


def test_decode_large_logits_lazy_rescale():
    """Scores spanning far more than the lazy-rescale threshold still give the exact softmax."""
    res = run_case(Q.BF16, Q.BF16, G=2, D=64, L=90, H=1, P=16, seed=5, qscale=12.0)
    check(*res)


@pytest.mark.parametrize("T,L", [pytest.param(4, 4, marks=SIM_SLOW), pytest.param(6, 40, marks=SIM_SLOW)])
def test_prefill_chunk_causal(T, L):
    res = run_case(Q.ISO3, Q.NVFP4, G=2, D=64, L=L, T=T, H=1, P=16, seed=T)
    check(*res)


# The tensor-core kernels (attention_mma) under the simulator run on Python emulations of their
# inline PTX (mma.m16n8k16 fragments, prmt, the decode asm; mma_ptx.py): the
# kernels' index logic is checked without a GPU (on a GPU these cases run the real kernels).
@pytest.mark.parametrize("kernel,kname,vname,G,D,T,L,P", [
    ("mma", "nvfp4", "nvfp4", 2, 64, 1, 20, 16),  # decode kernel
    ("mma", "iso3", "nvfp4", 4, 64, 1, 37, 16),
    pytest.param("mma", "nvfp4", "iso3", 3, 192, 1, 45, 8, marks=SIM_SLOW),  # ~22 s (32-token chunks: mma_t4)
    ("mma", "int8", "iso3", 1, 256, 1, 40, 16),
    ("mma", "nvfp4", "int8", 4, 64, 1, 120, 8),  # 4 blocks, warps merged per block, one warp empty
    ("mma_pipe", "int8", "iso3", 2, 64, 1, 134, 32),  # software-pipelined: 2 chunks per page, part pages
    ("mma_pipe", "bf16", "nvfp4", 4, 64, 1, 45, 8),  # pages shorter than a chunk
    ("mma_fa", "nvfp4", "iso3", 2, 64, 8, 90, 16),  # pages smaller than its 64-key tiles
    ("mma_wg", "bf16", "int8", 2, 64, 12, 150, 64),  # wgmma: 128-key tiles, a part tile, int8 V scales
    ("mma", "int8", "nvfp4", 4, 128, 1, 50, 16),  # int8 keys on s8 MMAs (k8)
    ("mma_k8off", "int8", "bf16", 2, 64, 1, 37, 8),  # int8 keys decoded to fp16
] + [pytest.param(*c, marks=SIM_SLOW) for c in [
        # ~30 s each under the simulator: -m slow keeps CI under its 10 minutes
        ("mma_fa", "bf16", "int8", 2, 128, 12, 75, 32),  # tile in a page
        ("mma_fa", "nvfp4", "iso3", 2, 64, 4, 140, 64),  # whole unmasked tiles of 4-bit keys (a split a page)
        ("mma_t4", "nvfp4", "iso3", 3, 192, 1, 45, 8),
        ("mma", "int8", "int8", 8, 64, 1, 37, 8), ("mma", "int8", "bf16", 1, 256, 1, 40, 16),
        ("mma_tok", "int8", "iso3", 3, 64, 5, 30, 16),  # k8 with several query tokens
        ("mma_fa8", "int8", "nvfp4", 4, 64, 20, 150, 64), ("mma_fa", "iso3", "bf16", 6, 128, 5, 33, 8),
        ("mma_fa", "bf16", "bf16", 1, 64, 20, 20, 16), ("mma_fa", "nvfp4", "nvfp4", 8, 256, 4, 50, 16),
        ("mma_wg8", "int8", "bf16", 2, 64, 40, 300, 32),  # two warpgroups, the second past the chunk
        ("mma_wg8a", "nvfp4", "bf16", 2, 64, 12, 150, 32),  # O += P V waited for at the next tile (no-op here)
        ("mma_wg8a", "int8", "nvfp4", 2, 128, 12, 330, 32),  # 6 tiles from part pages, int8 keys
        ("mma_wg8a", "bf16", "int8", 4, 128, 8, 300, 64),  # tiles a page each (fast path), int8 V scales
        ("mma_wg", "nvfp4", "iso3", 4, 128, 5, 70, 16),  # 64-key tiles over 4 pages, fp16 operands
        ("mma_fa", "int8", "iso3", 8, 64, 3, 50, 16), ("mma_fa", "iso3", "nvfp4", 4, 64, 6, 45, 8)]])
def test_mma_kernels_emulated(kernel, kname, vname, G, D, T, L, P):
    res = run_case(FMTS[kname], FMTS[vname], G=G, D=D, L=L, T=T, H=1, P=P, seed=T + L,
                   ws=A.AttentionWorkspace(16, T, G, D), kernel=kernel)
    check(*res)


# All slow: a block of 384 simulator threads took 19-366 s a case on 2 cores (session 37: the same
# case 19 s in one run, 152 and 362 s in others), enough to push CI past its time. The gpu tests
# cover these kernels on the device; run these with -m slow before a device call.
@pytest.mark.parametrize("kernel,kname,vname,G,D,T,L,P", [
    # 7 tiles of 64 keys in one page, a part tile at the end; the producer's 16-byte loads
    pytest.param("mma_wg8w", "nvfp4", "iso3", 2, 128, 12, 420, 512, marks=SIM_SLOW),
    # a third tile in flight: 7 tiles = two rounds of the three slots and one
    pytest.param("mma_wg8w3", "iso3", "nvfp4", 2, 128, 12, 420, 512, marks=SIM_SLOW),
    # int8 scales of both planes, 16-byte loads of int8 codes (2 chunks an item)
    pytest.param("mma_wg8w", "int8", "int8", 4, 128, 9, 700, 1024, marks=SIM_SLOW),
    pytest.param("mma_wg8w", "int8", "int8", 2, 64, 9, 700, 1024, marks=SIM_SLOW),
    # the 2nd warpgroup past the chunk; 2 items a row at d 64
    pytest.param("mma_wg8w", "iso3", "nvfp4", 2, 64, 40, 700, 1024, marks=SIM_SLOW),
    # bf16 planes by cp.async into the buffer once it is free: both (three tiles in flight), K only
    # (two), V only (two)
    pytest.param("mma_wg8w3", "bf16", "bf16", 2, 128, 12, 420, 512, marks=SIM_SLOW),
    pytest.param("mma_wg8w", "bf16", "int8", 2, 128, 12, 420, 512, marks=SIM_SLOW),
    pytest.param("mma_wg8w", "nvfp4", "bf16", 2, 64, 40, 700, 1024, marks=SIM_SLOW),
    # the consumer warpgroups' turns and FULL barriers of their own (decoded and copied tiles)
    pytest.param("mma_wg8w3pp", "nvfp4", "iso3", 2, 128, 12, 420, 512, marks=SIM_SLOW),
    pytest.param("mma_wg8w3pp", "bf16", "bf16", 2, 128, 12, 420, 512, marks=SIM_SLOW)])
def test_warp_specialized_prefill_emulated(kernel, kname, vname, G, D, T, L, P):
    """wg8w: the producer warpgroup decodes tiles into a ring of WS_STAGES buffers and the two
    consumer warpgroups take them, by named barriers, which the simulator runs for real and which
    fail here if a thread arrives twice in one phase (a missing wait: dropping the consumers'
    wait for a full buffer fails this test). One page, hence one split: the block has more tiles
    than the ring has buffers, so every buffer is refilled. (Cases of many splits pass too, but the
    simulator's lock per module makes their producers slow enough at times for a consumer's
    barrier to time out after 120 s, so they are gpu tests.)"""
    from coldkv.numba_kernels import attention_prefill as AP

    assert L <= P and -(-L // AP.tile_keys(D, True)) > AP.WS_STAGES
    res = run_case(FMTS[kname], FMTS[vname], G=G, D=D, L=L, T=T, H=1, P=P, seed=T + L,
                   ws=A.AttentionWorkspace(16, T, G, D), kernel=kernel)
    check(*res)


@pytest.mark.parametrize("kernel,kname,vname,G,D,L,P,qscale", [
    ("mma_tm", "nvfp4", "nvfp4", 2, 64, 24, 16, 1.0),  # a part last chunk, heads 2..7 empty columns
    pytest.param("mma_tm", "nvfp4", "iso3", 4, 128, 150, 16, 12.0, marks=SIM_SLOW),  # running max moves
    pytest.param("mma_tm", "bf16", "nvfp4", 3, 64, 70, 32, 1.0, marks=SIM_SLOW),  # bf16 keys, an odd G
    pytest.param("mma_tm_bulk", "iso3", "bf16", 8, 64, 100, 16, 4.0, marks=SIM_SLOW),  # every column a head
    pytest.param("mma_tm_t4", "nvfp4", "nvfp4", 2, 64, 150, 32, 1.0, marks=SIM_SLOW)])  # two m16 tiles a chunk
def test_tokens_on_rows_decode(kernel, kname, vname, G, D, L, P, qscale):
    """mma_tm: the K product with 16 tokens on the MMA rows and the heads on its columns; the
    softmax then runs per head pair over 8 lanes and movmatrix (emulated) transposes P for the V
    product. Against the reference, and within the rounding of the plain build's output."""
    _tm_case(kernel, kname, vname, G, D, L, 1, P, L + G, 16, qscale)


def _tm_case(kernel, kname, vname, G, D, L, H, P, seed, splits, qscale=1.0):
    """A tm build on a fresh cache: within the reference's bound, and within 4x its p-rounding term
    of the plain build's output on the same cache (not bitwise: each lane sums its share of p first)."""
    tm, plain = (run_case(FMTS[kname], FMTS[vname], G=G, D=D, L=L, H=H, P=P, seed=seed, qscale=qscale,
                          ws=A.AttentionWorkspace(splits, 1, G * H, D), kernel=k) for k in (kernel, "mma_notm"))
    check(*tm)
    np.testing.assert_allclose(tm[0], plain[0], rtol=0, atol=4 * float(tm[3].max()) + 1e-6)


@SIM_SLOW
def test_tokens_on_rows_same_through_every_loop():
    """tm's arithmetic does not depend on how the chunks arrive or where q is held: the plain loop,
    the pipelined one and the bulk ring (q in registers or in shared memory) give bitwise the same
    output, holes and a part last page included."""
    _decode_builds_equal(Q.NVFP4, Q.BF16, 150, 16, 3, [{"mma_tm": True}, {"mma_tm": True, "mma_pipe": True},
                                                        {"mma_tm": True, "mma_bulk": True},
                                                        {"mma_tm": True, "mma_bulk": True, "mma_qsmem": True}],
                         holes=[(0, 2), (1, 5)])


def test_tokens_on_rows_refuses_int8():
    with pytest.raises(ValueError, match="tm needs"):
        M.get_kernel(Q.INT8, Q.NVFP4, 4, 64, tm=True)
    with pytest.raises(ValueError, match="tm needs"):
        M.get_kernel(Q.NVFP4, Q.INT8, 4, 64, tm=True)


def test_wgmma_prefill_refuses_what_it_cannot_run():
    """head_dim 256 (128 accumulator registers for O alone), part warpgroups and the dropped
    variants (four tiles in flight, turns without the producer warpgroup): a clear error."""
    from coldkv.numba_kernels import attention_prefill as AP

    with pytest.raises(ValueError, match="head_dim <= 128"):
        AP.get_prefill_kernel(Q.BF16, Q.BF16, 2, 256, kind="wg")
    with pytest.raises(ValueError, match="warp-specialized"):  # its producer loads codes, not pre-decoded rows
        AP.get_prefill_kernel(Q.NVFP4, Q.NVFP4, 2, 128, kind="wg", warps=8, ws=True, pre=(True, True))
    with pytest.raises(ValueError, match="whole warpgroups"):
        AP.get_prefill_kernel(Q.BF16, Q.BF16, 2, 128, kind="wg", warps=6)
    with pytest.raises(ValueError, match="2 or 3 tiles"):
        AP.get_prefill_kernel(Q.NVFP4, Q.NVFP4, 2, 128, kind="wg", warps=8, ws=True, depth=4)
    with pytest.raises(ValueError, match="take turns in the warp-specialized kernel only"):
        AP.get_prefill_kernel(Q.BF16, Q.BF16, 2, 128, kind="wg", warps=8, pingpong=True)
    with pytest.raises(ValueError, match="8192 / head_dim"):  # wrong on the H200, right in the simulator
        AP.get_prefill_kernel(Q.BF16, Q.BF16, 2, 128, kind="wg", warps=8, chb=128)


def _decode_builds_equal(kf, vf, L, P, seed, knobs, holes=(), G=2, D=64, splits=16):
    """Decode (one kv head) with the tensor-core kernel under each knob setting of `knobs`
    (paged_attention_cuda keywords; one with plan_len launches from a device position) over one
    cache, (plane, page) entries of `holes` unallocated: the outputs are finite and bitwise equal.
    Returns (the output, q, dense K, dense V) for a reference check."""
    H = 1
    pools, table, gscale, kd, vd = make_cache(kf, vf, L, H, D, P, seed)
    table = table.copy()
    for plane, page in holes:
        table[plane, 0, page] = -1
    q = np.random.default_rng(seed + 1).standard_normal((1, G * H, D)).astype(np.float32)
    (kc, ks), (vc, vs) = pools
    outs = []
    for kw in knobs:
        out = cuda.to_device(np.full((1, G * H, D), np.nan, np.float32))
        pos = cuda.to_device(np.array([L - 1], np.int32)) if "plan_len" in kw else L - 1
        A.paged_attention_cuda(cuda.to_device(q), out, pos, 0.125, kf, cuda.to_device(kc), cuda.to_device(ks),
                               vf, cuda.to_device(vc), cuda.to_device(vs), cuda.to_device(gscale),
                               cuda.to_device(table), A.AttentionWorkspace(splits, 1, G * H, D), check_cold=False,
                               kernel="mma", **kw)
        outs.append(out.copy_to_host())
    assert np.isfinite(outs[0]).all()
    for o in outs[1:]:
        np.testing.assert_array_equal(outs[0], o)
    return outs[0], q, kd, vd


def test_pipelined_decode_equals_plain_with_unallocated_pages():
    """The software-pipelined decode loop (mma_pipe) walks the same chunks in the same order as the
    plain one, skipping unallocated (-1) pages: bitwise equal outputs, holes and a part page included."""
    _decode_builds_equal(Q.NVFP4, Q.INT8, 150, 16, 3, [{"mma_pipe": False}, {"mma_pipe": True}],
                         holes=[(0, 2), (1, 5)])  # a K page and a V page missing


def test_dependent_launch_of_the_merge_equals_plain():
    """mma_pdl: the decode kernel triggers its dependents and the split merge waits for it in a
    programmatic dependent launch (launch.launch_dependent). The same kernels' arithmetic: bitwise
    the plain launch (here the simulator's sequential launches; test_gpu_decode_dependent_launch
    on the device, where the merge really starts under the attention kernel's tail)."""
    _decode_builds_equal(Q.NVFP4, Q.INT8, 40, 8, 3, [{"mma_pdl": False}, {"mma_pdl": True}], holes=[(0, 2)])


@pytest.mark.parametrize("kname,vname", [("nvfp4", "int8"), pytest.param("int8", "iso3", marks=SIM_SLOW)])
def test_bulk_ring_decode_equals_plain(kname, vname):
    """mma_bulk reads each chunk from a shared-memory ring that cp.async.bulk fills (emulated here:
    the copy lands at once, the mbarrier counts phases) instead of from global memory: the same
    values in the same order, so bitwise the plain build, holes and a part last page included."""
    _decode_builds_equal(FMTS[kname], FMTS[vname], 150, 16, 3, [{"mma_bulk": False}, {"mma_bulk": True}],
                         holes=[(0, 2), (1, 5)])


def test_bulk_ring_refuses_what_it_cannot_hold():
    """Pages that are not whole chunks, and a ring over the 48 KB of static shared memory: clear errors."""
    from coldkv.numba_kernels import attention_mma as AM

    assert AM.supports_bulk(Q.INT8, Q.INT8, 4, 128, qsmem=True) and AM.supports_bulk(Q.NVFP4, Q.NVFP4, 4, 128)
    assert not AM.supports_bulk(Q.BF16, Q.BF16, 4, 128)
    with pytest.raises(ValueError, match="shared memory"):
        AM.get_kernel(Q.BF16, Q.BF16, 4, 128, bulk=True)
    with pytest.raises(ValueError, match="multiple of 16"):
        _decode_builds_equal(Q.NVFP4, Q.NVFP4, 40, 8, 3, [{"mma_bulk": True}])


def test_tensor_cores_only_where_the_gpu_has_the_instructions(monkeypatch):
    """mma.sync m16n8k16 needs sm_80 and the 4-bit formats' scale decode sm_89 (cvt .e4m3x2): on
    an older GPU "mma" is a clear error, not a PTX assembly failure ("auto" picks the fp32 kernel
    there, as it always does under the simulator)."""
    for cc, fmts, ok in [((8, 0), (Q.INT8, Q.BF16), True), ((8, 0), (Q.NVFP4, Q.INT8), False),
                         ((8, 0), (Q.BF16, Q.ISO3), False), ((8, 9), (Q.ISO3, Q.NVFP4), True),
                         ((7, 5), (Q.BF16, Q.BF16), False)]:
        monkeypatch.setattr(A, "_gpu_cc", lambda cc=cc: cc)
        if ok:
            assert A._use_mma("mma", *fmts, 4, 128)
        else:
            with pytest.raises(ValueError, match=f"sm_{cc[0]}{cc[1]}"):
                A._use_mma("mma", *fmts, 4, 128)


@pytest.mark.parametrize("hopper", [True, False])
def test_bulk_ring_only_where_the_gpu_has_bulk_copies(monkeypatch, hopper):
    """The 4-bit formats' tuned decode reads pages through the bulk ring (cp.async.bulk, sm_90+).
    Before Hopper the same build loads from global memory instead of failing to assemble, and
    asking for the ring there is a clear error."""
    class Built(Exception):
        pass

    def stop(*args):  # attention_mma.get_kernel(kf, vf, G, D, devpos, tiles, regs, u64, pipe, k8, qsmem, bulk, tm)
        raise Built(args[11], args[12])

    monkeypatch.setattr(A, "_has_bulk_copy", lambda: hopper)
    monkeypatch.setattr(M, "get_kernel", stop)
    with pytest.raises(Built) as built:
        run_case(Q.NVFP4, Q.NVFP4, G=4, D=128, L=40, H=1, kernel="mma")
    assert built.value.args == (hopper, True)  # (bulk, tm): tm either way
    if not hopper:
        with pytest.raises(ValueError, match="sm_90"):
            run_case(Q.NVFP4, Q.NVFP4, G=4, D=128, L=40, H=1, kernel="mma_bulk")


@SIM_SLOW  # ~10 s a case here; on the GPU, test_gpu_decode_int8_keys[mma_qs96-...] checks the build too
@pytest.mark.parametrize("kname,vname", [("int8", "iso3"), ("nvfp4", "int8")])
def test_decode_with_q_in_shared_memory_equals_registers(kname, vname):
    """mma_qsmem keeps q's MMA fragments in shared memory (int8 keys' s8 parts, or the fp16 pairs):
    the same products in the same order, so bitwise the register build (9 pages over the warps)."""
    _decode_builds_equal(FMTS[kname], FMTS[vname], 70, 8, 5, [{"mma_qsmem": False}, {"mma_qsmem": True}])


@SIM_SLOW
def test_pipelined_decode_with_q_in_shared_memory_equals_plain():
    """bench/attention_decode.py's int8@qsp: software-pipelined loads and q in shared memory together."""
    _decode_builds_equal(FMTS["int8"], FMTS["int8"], 70, 8, 5,
                         [{"mma_qsmem": False}, {"mma_qsmem": True, "mma_pipe": True}], holes=[(0, 2), (1, 5)])


def test_dec8_emulation_is_the_format():
    """The simulator's dec8_iso3 (which the fa kernel runs under the simulator; on a GPU the gpu
    tests check the PTX): pair i of a word = fp16 of nibbles i (low) and i + 4 (high), the values
    from ISO3's sign + integer magnitude."""
    from coldkv.numba_kernels import mma_ptx as M

    iso3 = (np.where(np.arange(16) & 8, -1.0, 1.0) * (np.arange(16) & 7)).astype(np.float16).view(np.uint16)
    words = [0, 0xFFFFFFFF, 0x88888888, 0x76543210, 0xFEDCBA98] + list(
        np.random.default_rng(7).integers(0, 2**32, 300, dtype=np.uint64))
    dec = M._sim_dec8(M._DEC8_ISO3)
    for w in words:
        w = int(w)
        nib = [(w >> (4 * n)) & 15 for n in range(8)]
        want = [int(iso3[nib[i]]) | (int(iso3[nib[i + 4]]) << 16) for i in range(4)]
        assert [int(x) for x in dec(w)] == want, hex(w)


@pytest.mark.skipif(not M.SIMULATED, reason="calls device functions from Python (on a GPU the kernel tests run them)")
def test_e2m1_operands_are_the_format():
    """The E2M1 operand pairs of the decode and prefill kernels (mma_ptx.e2m1_pair / dec4_e2m1, two
    PRMT-placed byte planes a word): pair a of a word = fp16 of nibbles a (low) and a + 4 (high)
    times 2^-14, from ml_dtypes' float4_e2m1fn; every byte value at every byte of the word, and
    random words. Times every E4M3 scale, the fp16 product is exact (the kernels rely on it)."""
    import ml_dtypes

    from coldkv.numba_kernels import mma_ptx as X

    tab = (np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
           * np.float32(2.0**-14)).astype(np.float16).view(np.uint16)
    words = [b << (8 * i) for b in range(256) for i in range(4)] + [0xFFFFFFFF, 0x88888888] + list(
        np.random.default_rng(8).integers(0, 2**32, 300, dtype=np.uint64))
    for w in words:
        w = int(w)
        nib = [(w >> (4 * n)) & 15 for n in range(8)]
        want = [int(tab[nib[a]]) | (int(tab[nib[a + 4]]) << 16) for a in range(4)]
        assert [int(X.e2m1_pair(np.uint32(w), a)) for a in range(4)] == want, hex(w)
        assert [int(p) for p in X.dec4_e2m1(np.uint32(w))] == want
    vals = np.unique(tab.view(np.float16).astype(np.float64))
    scales = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    prod = np.outer(vals, scales[np.isfinite(scales)])
    assert np.array_equal(prod.astype(np.float16).astype(np.float64), prod)


@pytest.mark.parametrize("T", [1, pytest.param(130, marks=SIM_SLOW)])  # 130 x 2 rows: the rows kernel (~30 s)
def test_reduce_empty_splits_change_nothing(monkeypatch, T):
    """A launch planned for a longer cache (plan_len: what the backend's captured prefill and
    decode graphs do) has more splits, the extra ones past the end empty (m = -inf, acc never
    written). The merge must give bitwise the result without them (the backend's per-chunk
    forward), not one summed in another order, and == the float64 merge. 4 reduce warps here (1
    in the other simulator tests), so a warp count taken from the split count (2 vs 3 warps for
    8 vs 12 splits) would change the order. The longer launch also writes out16, the output
    rounded to bf16 (fp16 at T 1) in the same kernel (the o_proj input the backend's round16 pass
    used to write): bitwise as ml_dtypes / numpy round out."""
    import ml_dtypes

    monkeypatch.setattr(A, "_SIM_MAX_WARPS", 4)
    rng = np.random.default_rng(3)
    Hq, D, n = 2, 64, 8
    m = rng.uniform(-4, 4, (n, T, Hq)).astype(np.float32)
    lsum = rng.uniform(0.5, 3, (n, T, Hq)).astype(np.float32)
    acc = rng.standard_normal((n, T, Hq, D)).astype(np.float32)
    m[2, 0, 1], lsum[2, 0, 1], acc[2, 0, 1] = -np.inf, 0.0, np.nan  # an empty split among the others
    w = np.exp2(m.astype(np.float64) - m.max(axis=0))
    ref = (w[..., None] * np.nan_to_num(acc)).sum(axis=0) / (w * lsum).sum(axis=0)[..., None]
    outs = []
    for N in (n, n + 4):
        ml = np.zeros((N, T, Hq, 2), np.float32)
        ml[:, :, :, 0] = -np.inf
        ml[:n, :, :, 0], ml[:n, :, :, 1] = m, lsum
        a = np.full((N, T, Hq, D), np.nan, np.float32)  # empty splits' acc: unwritten
        a[:n] = acc
        out = cuda.to_device(np.full((T, Hq, D), np.nan, np.float32))
        out16 = None if N == n else cuda.to_device(np.zeros((T, Hq, D), np.uint16))
        A._reduce(cuda.to_device(a), cuda.to_device(ml), N, out, 0, out16, out16_fp16=T == 1)
        outs.append(out.copy_to_host())
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=1e-6)
    want16 = outs[0].astype(np.float16 if T == 1 else ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(out16.copy_to_host(), want16)


@SIM_SLOW
def test_many_splits_share_a_workspace():
    """Several warps/blocks per head (tiny ppw) and a workspace reused across calls."""
    ws = A.AttentionWorkspace(64, 2, 2, 64)
    ws.n_sm = 8  # as on a bigger GPU: several splits for a short context
    for seed, L in [(1, 70), (2, 33)]:
        res = run_case(Q.NVFP4, Q.NVFP4, G=2, D=64, L=L, T=2, H=1, P=8, seed=seed, ws=ws)
        check(*res)


def _devpos_cases(kf, vf, G, D, L, H, P, positions, plan_len, ws, seed, kernel="auto"):
    """For each position: (device-position output, int-position output, reference, ref32), the
    query at `pos` seeing keys 0..pos of one cache, all launches planned for `plan_len`."""
    pools, table, gscale, kd, vd = make_cache(kf, vf, L, H, D, P, seed)
    (kc, ks), (vc, vs) = pools
    dev = [cuda.to_device(x) for x in (kc, ks, vc, vs, gscale, table)]
    Hq, sm = G * H, 1 / math.sqrt(D)
    q = np.random.default_rng(seed + 1).standard_normal((1, Hq, D)).astype(np.float32)
    qd = cuda.to_device(q)
    pos_dev = cuda.to_device(np.zeros(1, np.int32))
    out = []
    for pos in positions:
        pos_dev.copy_to_device(np.array([pos], np.int32))
        got = []
        for p in (pos_dev, pos):
            o = cuda.to_device(np.full((1, Hq, D), np.nan, np.float32))
            A.paged_attention_cuda(qd, o, p, sm, kf, dev[0], dev[1], vf, dev[2], dev[3], dev[4], dev[5], ws,
                                   plan_len=plan_len, **_kernel_kw(kernel))
            got.append(o.copy_to_host())
        out.append((got[0], got[1], *references(q, kd[: pos + 1], vd[: pos + 1], pos, sm, kf, vf, kernel)))
    return out


@SIM_SLOW  # 65-95 s in the simulator on a CI core; on a GPU test_gpu_device_position_mode covers every kernel
def test_device_position_mode():
    """pos0 as an int32[1] device array (CUDA-graph mode): one plan_len, several positions, the
    same result as an int position and the reference; splits past the end are empty partials."""
    ws = A.AttentionWorkspace(8, 1, 2, 64)  # 2 blocks = 8 splits, most empty at short positions
    for dgot, igot, *refs in _devpos_cases(Q.NVFP4, Q.INT8, 2, 64, 40, 1, 8, [5, 39], 64, ws, 7):
        np.testing.assert_array_equal(dgot, igot)  # same splits, same arithmetic
        check(dgot, *refs)


def test_device_position_arguments():
    ws = A.AttentionWorkspace(8, 1, 1, 64)
    q = cuda.to_device(np.zeros((1, 1, 64), np.float32))
    args = (0.125, Q.BF16, *Q.pool_arrays("bf16", 1, 8, 64), Q.BF16, *Q.pool_arrays("bf16", 1, 8, 64),
            np.ones((2, 1), np.float32), np.zeros((2, 1, 1), np.int32), ws)
    with pytest.raises(ValueError, match="plan_len"):  # the host cannot know the length
        A.paged_attention_cuda(q, q, cuda.to_device(np.zeros(1, np.int32)), *args)
    with pytest.raises(ValueError, match="int32"):
        A.paged_attention_cuda(q, q, cuda.to_device(np.zeros(1, np.int64)), *args, plan_len=8)
    with pytest.raises(ValueError, match="plan_len"):
        A.paged_attention_cuda(q, q, 7, *args, plan_len=4)


def test_plan_prefill():
    # bundled model, 512-token chunk: 32 tokens per block (G 2), splits capped by the workspace
    assert A.plan_prefill(512, 2, 2, 131072, 64, 132, 16) == (16, 16)
    assert A.plan_prefill(512, 8, 4, 4096, 64, 132, 16) == (32, 3)  # 256 blocks already: ~4 per SM
    assert A.plan_prefill(5, 1, 8, 100, 64, 132, 64) == (1, 2)  # at most one split per page
    # given the kernel's resident blocks (fa: 2 per SM), a grid that fills them is not split
    assert A.plan_prefill(8192, 2, 2, 32768, 64, 132, 4, resident=264) == (256, 1)
    assert A.plan_prefill(2048, 2, 2, 32768, 64, 132, 16, resident=264) == (64, 5)  # 128 blocks: split


def test_prefill_chunk_tokens():
    """The CUDA backend's chunk grows until the fa grid (4 x 16 // G tokens a block and kv head)
    fills 2 blocks per SM, within 2048..8192 tokens and the buffer budget; with the wgmma kernels
    ("wg") up to 32768 tokens within the budget."""
    from coldkv.runtime.config import ModelArgs
    from coldkv.runtime.cuda_backend import prefill_chunk_tokens

    base = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 8, "vocab_size": 8192,
            "head_dim": 128}
    tiny = ModelArgs.from_dict({**base, "num_attention_heads": 4, "num_key_value_heads": 2})
    assert prefill_chunk_tokens(tiny, 132) == 8192  # 2048: 128 blocks, 4096: 256, 8192: 512 >= 264
    assert prefill_chunk_tokens(tiny, 100) == 4096
    gqa4 = ModelArgs.from_dict({**base, "num_attention_heads": 32, "num_key_value_heads": 8})
    assert prefill_chunk_tokens(gqa4, 132) == 2048  # 1024 blocks already
    wide = ModelArgs.from_dict({**base, "hidden_size": 16384, "intermediate_size": 65536,
                                "num_attention_heads": 4, "num_key_value_heads": 2})
    assert prefill_chunk_tokens(wide, 132) == 2048  # 4096 tokens of buffers would pass 1 GiB
    assert prefill_chunk_tokens(tiny, 132, "wg") == 32768  # ~1.0e9 bytes of buffers
    assert prefill_chunk_tokens(gqa4, 132, "wg") == 4096  # 8192 tokens: 1.24e9 bytes
    assert prefill_chunk_tokens(wide, 132, "wg") == 2048


def test_prefill_kernel_names(monkeypatch):
    """The CUDA backend's prefill_attention names: paged_attention_cuda's keywords, every knob
    given; "auto" is _prefill_auto's choice (fa without an sm_90 GPU or above head_dim 128; on
    one, by format: wg8w3 for 4-bit or bf16 K and V, wg8wpp for int8 K and V, else wg8a); an unknown name
    is an error."""
    off = {"mma_pingpong": False, "mma_pv_async": False, "mma_ws": False, "mma_depth": 2}
    assert A.prefill_kernel("fa", 128) == {"mma_prefill": "fa", "mma_warps": A.NWARPS, "mma_pv_async": False,
                                           "mma_ws": False, "mma_depth": 2}
    assert A.prefill_kernel("wg8a", 128) == {"mma_prefill": "wg", "mma_warps": 8, **off, "mma_pv_async": True}
    assert A.prefill_kernel("wg8w", 128) == {"mma_prefill": "wg", "mma_warps": 8, **off, "mma_pv_async": True,
                                             "mma_ws": True}
    assert A.prefill_kernel("wg8w3", 128) == {**A.prefill_kernel("wg8w", 128), "mma_depth": 3}
    assert A.prefill_kernel("wg8w3pp", 128) == {**A.prefill_kernel("wg8w3", 128), "mma_pingpong": True}
    assert A.prefill_kernel("auto", 128) == A.PREFILL_KERNELS[A._prefill_auto(128)]
    nv, b = Q.NVFP4, Q.BF16
    assert A.prefill_kernel("auto", 128, nv, nv) == A.PREFILL_KERNELS[A._prefill_auto(128, nv, nv)]
    assert A.prefill_kernel("auto", 256)["mma_prefill"] == "fa"
    monkeypatch.setattr(A, "_has_wgmma", lambda: True)  # the choice on an sm_90 GPU
    i8, iso = Q.INT8, Q.ISO3
    assert [A._prefill_auto(128, k, v) for k, v in [(nv, nv), (nv, iso), (i8, i8), (b, nv), (i8, nv), (b, b)]] == \
        ["wg8w3", "wg8w3", "wg8wpp", "wg8a", "wg8a", "wg8w3"]
    assert A._prefill_auto(256, nv, nv) == "fa"
    with pytest.raises(ValueError, match="unknown prefill attention kernel 'rows'"):
        A.prefill_kernel("rows", 128)


def test_padded_rows_and_cache_capacity():
    """A short chunk's pass: >= its tokens, at most 2x below 1024 and 1.33x above 3072 rows, few
    distinct sizes; a cache's capacity leaves room for the padded last chunk of any prompt split
    into chunks of a multiple of 1024 tokens."""
    from coldkv.runtime.cuda_backend import PAD_QUANTUM, cache_tokens, padded_rows

    sizes = {padded_rows(t) for t in range(1, 8193)}
    assert sizes == {256, 512} | {1024 * k for k in range(1, 9)}
    for t in range(1, 8193):
        r = padded_rows(t)
        assert t <= r <= max(256, 2 * t) and (t <= 3072 or r <= 4 * t / 3 + 1)
    for n in (1, 255, 591, 4096, 4097, 32768 + 100):
        for new in (0, 1, 64):
            for chunk in (1024, 2048, 8192):
                last = (n - 1) // chunk * chunk
                assert last + min(padded_rows(n - last), chunk) <= cache_tokens(n + new)
    assert cache_tokens(4160) == 5120 and cache_tokens(4096) == 4096 and cache_tokens(0) == PAD_QUANTUM


def test_plan_splits():
    ppw, nblk = A.plan_splits(1, 8, 131072, 64, 132, 4096)
    assert ppw * nblk * A.NWARPS >= 2048 and nblk * 8 * A.NWARPS >= 132 * 8
    ppw, nblk = A.plan_splits(512, 8, 4096, 64, 132, 4096)
    assert nblk == 1 and ppw == 16
    assert A.plan_splits(1, 1, 6400, 64, 132, 8) == (13, 2)  # capped by the workspace
    # one wave of a kernel that fits 3 blocks per SM (396): 47 blocks of 11 pages per kv head,
    # not the 64 x 8 = 512 blocks (1.3 waves) of the 16-warps-per-SM rule
    ppw, nblk = A.plan_splits(1, 8, 131072, 64, 132, 4096, resident=3 * 132)
    assert (ppw, nblk) == (11, 47) and nblk * 8 <= 396 and ppw * nblk * A.NWARPS >= 2048
    assert A.plan_splits(1, 8, 131072, 64, 132, 4096, resident=4 * 132)[1] * 8 <= 528


def test_workspace_limits():
    with pytest.raises(ValueError):
        A.AttentionWorkspace(2, 1, 4, 64)  # less than one block of splits
    with pytest.raises(ValueError):
        A.AttentionWorkspace(8, 1, 4, 512)  # head_dim above 256
    ws = A.AttentionWorkspace(8, 2, 1, 64)
    q = np.zeros((3, 1, 64), np.float32)
    with pytest.raises(ValueError):  # more query tokens than the workspace holds
        A.paged_attention_cuda(q, q.copy(), 0, 0.125, Q.BF16, *Q.pool_arrays("bf16", 1, 8, 64), Q.BF16,
                               *Q.pool_arrays("bf16", 1, 8, 64), np.ones((2, 1), np.float32),
                               np.zeros((2, 1, 1), np.int32), ws)


def test_cold_pages_refused_from_host_table():
    pools, table, gscale, kd, vd = make_cache(Q.BF16, Q.BF16, 20, 1, 64, 8, 0)
    table[0, 0, 1] = -2
    ws = A.AttentionWorkspace(8, 1, 1, 64)
    (kc, ks), (vc, vs) = pools
    q = np.zeros((1, 1, 64), np.float32)
    with pytest.raises(NotImplementedError):
        A.paged_attention_cuda(q, q.copy(), 19, 0.125, Q.BF16, kc, ks, Q.BF16, vc, vs, gscale, table, ws,
                               check_cold=True)


# ------------------------------------------------------------------------------ GPU, large
def _sdpa(q, kd, vd, pos0, sm):
    torch = pytest.importorskip("torch")
    T, Hq, D = q.shape
    qt = torch.from_numpy(q).cuda().permute(1, 0, 2)[None]  # [1, Hq, T, D]
    kt = torch.from_numpy(kd).cuda().permute(1, 0, 2)[None]
    vt = torch.from_numpy(vd).cuda().permute(1, 0, 2)[None]
    L = kd.shape[0]
    mask = torch.arange(L, device="cuda")[None, :] <= (pos0 + torch.arange(T, device="cuda"))[:, None]
    o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=sm, enable_gqa=True)
    return o[0].permute(1, 0, 2).cpu().numpy()


KERNELS = ["fma", "mma", "mma_pipe"]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kname,vname,G,D", [
    ("bf16", "bf16", 4, 128), ("int8", "int8", 4, 128), ("nvfp4", "nvfp4", 4, 128), ("nvfp4", "iso3", 4, 128),
    ("nvfp4", "nvfp4", 6, 256), ("bf16", "bf16", 6, 256), ("int8", "nvfp4", 1, 64), ("iso3", "bf16", 8, 128)])
def test_gpu_decode_large(kname, vname, G, D, kernel):
    L, H = 20000 + 17, 2
    res = run_case(FMTS[kname], FMTS[vname], G=G, D=D, L=L, H=H, P=64, seed=G + D,
                   ws=A.AttentionWorkspace(1024, 1, G * H, D), kernel=kernel)
    check(*res)


@pytest.mark.gpu
@pytest.mark.parametrize("kname,vname,G,D", [("int8", "int8", 4, 128), ("nvfp4", "nvfp4", 4, 128),
                                             ("bf16", "bf16", 4, 128), ("iso3", "nvfp4", 6, 256)])
def test_gpu_decode_dependent_launch(kname, vname, G, D):
    """The split merge launched as a programmatic dependent of the decode kernel (mma_pdl): it may
    start while the attention kernel's last blocks run and waits (griddepcontrol.wait) before its
    reads. Against the reference, and bitwise the plain launch, repeated back to back so that a
    merge reading partials too early would show."""
    res = run_case(FMTS[kname], FMTS[vname], G=G, D=D, L=20000 + 17, H=2, P=64, seed=G + D,
                   ws=A.AttentionWorkspace(1024, 1, G * 2, D), kernel="mma_pdl")
    check(*res)
    _decode_builds_equal(FMTS[kname], FMTS[vname], 3000 + 7, 32, 4, [{}] + [{"mma_pdl": True}] * 4,
                         holes=[(0, 2), (1, 5), (0, 60)])


@pytest.mark.gpu
@pytest.mark.parametrize("kname,vname,G,D", [("int8", "int8", 4, 128), ("nvfp4", "nvfp4", 4, 128),
                                             ("nvfp4", "iso3", 4, 128), ("int8", "nvfp4", 1, 64),
                                             ("iso3", "int8", 8, 128)])
def test_gpu_decode_bulk_ring(kname, vname, G, D):
    """The bulk ring (cp.async.bulk into shared memory, mbarrier waits) on the device: against the
    reference, and bitwise the plain build over a cache with holes and a part last page."""
    res = run_case(FMTS[kname], FMTS[vname], G=G, D=D, L=20000 + 17, H=2, P=64, seed=G + D,
                   ws=A.AttentionWorkspace(1024, 1, G * 2, D), kernel="mma_bulk")
    check(*res)
    _decode_builds_equal(FMTS[kname], FMTS[vname], 3000 + 7, 32, 4, [{"mma_bulk": False}, {"mma_bulk": True}],
                         holes=[(0, 2), (1, 5), (0, 60)])


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,kname,vname,G,D", [
    ("mma_tm", "nvfp4", "nvfp4", 4, 128), ("mma_tm", "iso3", "iso3", 4, 128), ("mma_tm", "bf16", "bf16", 4, 128),
    ("mma_tm", "nvfp4", "nvfp4", 6, 256), ("mma_tm", "bf16", "nvfp4", 8, 64), ("mma_tm", "iso3", "bf16", 1, 64),
    ("mma_tm_t4", "nvfp4", "nvfp4", 4, 128), ("mma_tm_t4", "nvfp4", "iso3", 4, 128),
    ("mma_tm_t4", "iso3", "iso3", 4, 128), ("mma_tm_t4", "nvfp4", "bf16", 3, 64),
    ("mma_tm_qs96", "nvfp4", "nvfp4", 4, 128), ("mma_tm_qs96", "nvfp4", "iso3", 4, 128)])
def test_gpu_decode_tokens_on_rows(kernel, kname, vname, G, D):
    """Tokens on the K product's MMA rows (movmatrix on the device): against the reference over
    20017 tokens, and close to the plain build."""
    _tm_case(kernel, kname, vname, G, D, 20000 + 17, 2, 64, G + D, 1024)


def test_long_splits_read_32_token_chunks():
    """The rule: 32-token chunks for the measured 4-bit builds from 12 pages a warp (nvfp4 from 8
    on a GPU of more than 4 TB/s), whole chunks of a page only; every other build keeps its 16-token
    chunks."""
    assert A.long_chunks(Q.NVFP4, Q.NVFP4, 4, 128, 64, 12) and A.long_chunks(Q.ISO3, Q.ISO3, 4, 128, 32, 40)
    assert not A.long_chunks(Q.NVFP4, Q.NVFP4, 4, 128, 64, 11)
    assert not A.long_chunks(Q.NVFP4, Q.NVFP4, 4, 128, 64, 8, 3.35)  # an H100
    assert A.long_chunks(Q.NVFP4, Q.NVFP4, 4, 128, 64, 8, 4.8)  # an H200
    assert not A.long_chunks(Q.NVFP4, Q.NVFP4, 4, 128, 64, 7, 4.8)
    assert not A.long_chunks(Q.ISO3, Q.ISO3, 4, 128, 64, 8, 4.8)
    assert not A.long_chunks(Q.NVFP4, Q.NVFP4, 4, 128, 48, 40)  # a page of 1.5 chunks
    assert not any(A.long_chunks(kf, vf, G, D, 64, 40) for kf, vf, G, D in [
        (Q.INT8, Q.INT8, 4, 128), (Q.BF16, Q.BF16, 4, 128), (Q.NVFP4, Q.NVFP4, 6, 256), (Q.NVFP4, Q.ISO3, 4, 128)])


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "iso3"])
def test_gpu_decode_long_splits_read_32_token_chunks(fmt):
    """The default build where a warp has >= 12 pages (49169 tokens over a 64-split workspace: 13)
    is the ring with 32-token chunks: bitwise the explicit mma_tiles=4 build, eager and from a
    device position, and within the reference's bound."""
    f, L = FMTS[fmt], 49152 + 17
    t4 = {"mma_tm": True, "mma_bulk": True, "mma_tiles": 4, "max_registers": 128}
    got, q, kd, vd = _decode_builds_equal(f, f, L, 64, 21, [{}, t4, {"plan_len": L}], G=4, D=128, splits=64)
    check(got, *references(q, kd, vd, L - 1, 0.125, f, f, "mma_tm_t4"))


@pytest.mark.gpu
def test_gpu_dram_bandwidth_is_read():
    """The peak DRAM bandwidth the long-chunk rule reads from the driver is a GPU's (H100 3.35,
    H200 4.8 TB/s), not the 0.0 that keeps the H100's rule."""
    assert 0.1 < A._dram_tbps() < 20.0


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["mma", "mma_k8off", "mma_qs96"])
@pytest.mark.parametrize("vname,G,D,P", [("int8", 4, 128, 64), ("nvfp4", 8, 64, 16), ("bf16", 6, 256, 32),
                                         ("iso3", 3, 128, 8)])
def test_gpu_decode_int8_keys(vname, G, D, P, kernel):
    """int8 keys on s8 tensor cores (k8, the default), decoded to fp16, and with q in shared memory
    (qsmem at 96 registers: the int8 decode candidate for 5 blocks an SM), on the device."""
    res = run_case(Q.INT8, FMTS[vname], G=G, D=D, L=20000 + 33, H=2, P=P, seed=G * D + P,
                   ws=A.AttentionWorkspace(1024, 1, G * 2, D), kernel=kernel)
    check(*res)


@pytest.mark.gpu
@pytest.mark.parametrize("kname,vname,G,D,T,L,P", [
    ("bf16", "bf16", 2, 128, 200, 3000, 64), ("int8", "int8", 2, 128, 77, 2000, 64),
    ("nvfp4", "nvfp4", 2, 128, 512, 4100, 64), ("iso3", "iso3", 2, 128, 130, 1500, 32),
    ("nvfp4", "iso3", 4, 128, 96, 2500, 64), ("int8", "nvfp4", 6, 256, 50, 1200, 64),
    ("bf16", "int8", 1, 64, 70, 900, 16), ("iso3", "bf16", 8, 128, 40, 700, 8),
    ("nvfp4", "bf16", 2, 128, 300, 300, 64)])  # a first chunk (pos0 = 0): rows see < 1 split
@pytest.mark.parametrize("kernel", ["mma_fa", "mma_wg"])
def test_gpu_prefill_kernels(kname, vname, G, D, T, L, P, kernel):
    """The prefill kernels ((token, head) rows, shared K/V tiles; mma.sync and wgmma): every format
    as K and V, G 1..8 (G 6 and 8 leave rows unused), pages smaller than their key tiles, chunks
    not a multiple of their blocks."""
    if kernel == "mma_wg" and D > 128:
        pytest.skip("the wgmma kernel is for head_dim <= 128 (its O accumulators)")
    res = run_case(FMTS[kname], FMTS[vname], G=G, D=D, L=L, T=T, H=2, P=P, seed=T + L,
                   ws=A.AttentionWorkspace(64, T, G * 2, D), kernel=kernel)
    check(*res)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["mma_fa8", "mma_wg8", "mma_wg8a"])
@pytest.mark.parametrize("kname,vname,G,D,T,L,P", [("nvfp4", "int8", 2, 128, 200, 3000, 64),
                                                   ("bf16", "iso3", 4, 64, 90, 1000, 16)])
def test_gpu_prefill_8_warps(kname, vname, G, D, T, L, P, kernel):
    res = run_case(FMTS[kname], FMTS[vname], G=G, D=D, L=L, T=T, H=2, P=P, seed=T + L + 1,
                   ws=A.AttentionWorkspace(64, T, G * 2, D), kernel=kernel)
    check(*res)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["mma_" + k for k, kw in A.PREFILL_KERNELS.items() if kw["mma_ws"]])
@pytest.mark.parametrize("kname,vname,G,D,T,L,P", [("nvfp4", "nvfp4", 2, 128, 2048, 9000, 64),
                                                   ("int8", "int8", 2, 128, 700, 6000, 64),
                                                   ("int8", "iso3", 4, 64, 300, 1000, 16),
                                                   ("iso3", "nvfp4", 2, 128, 100, 5000, 32),
                                                   ("bf16", "bf16", 2, 128, 2048, 9000, 64),
                                                   ("bf16", "nvfp4", 4, 64, 300, 1000, 16)])
def test_gpu_prefill_warp_specialized(kname, vname, G, D, T, L, P, kernel):
    """wg8w (a producer warpgroup decodes, two consumers multiply; 16-byte loads of 4-bit codes),
    wg8w3 (three tiles of loads in flight),
    wg8w3pp / wg8wpp (the consumer warpgroups take turns):
    long rings of tiles, many blocks, and blocks whose split range is empty (the early query
    blocks' last splits)."""
    res = run_case(FMTS[kname], FMTS[vname], G=G, D=D, L=L, T=T, H=2, P=P, seed=T + L + 2,
                   ws=A.AttentionWorkspace(64, T, G * 2, D), kernel=kernel)
    check(*res)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["mma_fa", "mma_fa8"] + ["mma_" + k for k in A.PREFILL_KERNELS if k != "fa"])
def test_gpu_prefill_device_position(kernel):
    """The backend's prefill launch: an int32[1] device position and plan_len; == int mode
    (bitwise, same plan) == reference, at three chunk positions of one cache."""
    kf, vf, G, H, D, P, L, T = Q.NVFP4, Q.INT8, 2, 2, 128, 64, 3000, 256
    pools, table, gscale, kd, vd = make_cache(kf, vf, L, H, D, P, 21)
    (kc, ks), (vc, vs) = pools
    dev = [cuda.to_device(x) for x in (kc, ks, vc, vs, gscale, table)]
    q = np.random.default_rng(22).standard_normal((T, G * H, D)).astype(np.float32)
    qd = cuda.to_device(q)
    ws = A.AttentionWorkspace(16, T, G * H, D)
    sm = 1 / math.sqrt(D)
    pos_dev = cuda.to_device(np.zeros(1, np.int32))
    for pos0 in (0, 1000, L - T):
        pos_dev.copy_to_device(np.array([pos0], np.int32))
        got = []
        for p in (pos_dev, pos0):
            o = cuda.to_device(np.full((T, G * H, D), np.nan, np.float32))
            A.paged_attention_cuda(qd, o, p, sm, kf, dev[0], dev[1], vf, dev[2], dev[3], dev[4], dev[5], ws,
                                   plan_len=8192, **_kernel_kw(kernel))
            got.append(o.copy_to_host())
        np.testing.assert_array_equal(got[0], got[1])
        n = pos0 + T
        check(got[0], *references(q, kd[:n], vd[:n], pos0, sm, kf, vf, kernel))


def _force_prefill_splits(monkeypatch, splits):
    """plan_prefill with its split count replaced; -> a list of the splits of each launch."""
    plan, seen = A.plan_prefill, []

    def forced(*args, **kw):
        nqb, _ = plan(*args, **kw)
        seen.append(splits)
        return nqb, splits
    monkeypatch.setattr(A, "plan_prefill", forced)
    return seen


def _no_reduce(monkeypatch):
    def fail(*args, **kw):
        raise AssertionError("an unsplit fa launch ran the reduce")
    monkeypatch.setattr(A, "_reduce", fail)


@pytest.mark.parametrize("kname,vname,devpos", [("nvfp4", "iso3", False)] + [
    pytest.param(*c, marks=SIM_SLOW) for c in [("iso3", "bf16", True), ("int8", "nvfp4", False)]])
def test_fa_predecoded_planes_equal_decoding(monkeypatch, kname, vname, devpos):
    """nvfp4/iso3 planes decoded once into a scratch (launch_predecode) and copied into the fa
    kernel's shared tiles like bf16 rows: bitwise the output of the kernel that decodes every
    tile itself, an unallocated page included; the scratch starts NaN, so a row read before it
    was written would show."""
    kf, vf, G, H, D, P, L, T = FMTS[kname], FMTS[vname], 2, 1, 64, 16, 40, 6
    _force_prefill_splits(monkeypatch, 2)  # few simulated blocks
    pools, table, gscale, kd, vd = make_cache(kf, vf, L, H, D, P, 41)
    table = table.copy()
    table[0, 0, 1] = -1  # a lost K page: its keys are masked in both builds
    (kc, ks), (vc, vs) = pools
    dev = [cuda.to_device(x) for x in (kc, ks, vc, vs, gscale, table)]
    q = cuda.to_device(np.random.default_rng(42).standard_normal((T, G * H, D)).astype(np.float32))
    pos = cuda.to_device(np.array([L - T], np.int32)) if devpos else L - T
    outs = []
    for pre in (False, True):
        scratch = tuple(cuda.to_device(np.full(c.shape[0] * P * D // 2, 0x7E007E00, np.uint32)) for c in (kc, vc))
        out = cuda.to_device(np.full((T, G * H, D), np.nan, np.float32))
        A.paged_attention_cuda(q, out, pos, 1 / math.sqrt(D), kf, dev[0], dev[1], vf, dev[2], dev[3], dev[4], dev[5],
                               A.AttentionWorkspace(16, T, G * H, D), check_cold=False, plan_len=L + 8,
                               kernel="mma", mma_prefill="fa", prefill_scratch=scratch if pre else None)
        outs.append(out.copy_to_host())
        written = [bool((x.copy_to_host() != 0x7E007E00).any()) for x in scratch]
        assert written == [pre and kf in (Q.NVFP4, Q.ISO3), pre and vf in (Q.NVFP4, Q.ISO3)]
    assert np.isfinite(outs[0]).all()
    np.testing.assert_array_equal(outs[0], outs[1])


def test_fa_prefill_unsplit_writes_the_output(monkeypatch):
    """One split: the fa kernel normalizes and writes `out` itself (no reduce kernel); every
    output element is written (out starts NaN) and equals the reference."""
    seen = _force_prefill_splits(monkeypatch, 1)
    _no_reduce(monkeypatch)
    check(*run_case(Q.BF16, Q.NVFP4, G=2, D=64, L=20, T=4, H=1, P=16, seed=11, kernel="mma_fa"))
    assert seen == [1]


@pytest.mark.parametrize("splits,f16", [(1, False), pytest.param(1, True, marks=SIM_SLOW),
                                        pytest.param(2, False, marks=SIM_SLOW)])
def test_prefill_writes_the_16_bit_output(monkeypatch, splits, f16):
    """out16 (o_proj's input) is `out` rounded to bf16 / fp16 (ml_dtypes), bitwise: written by
    the prefill kernel itself when a chunk has one split (no reduce, no round16 pass), else by the
    split merge; out16 starts as NaN bits, so an element left unwritten would show."""
    import ml_dtypes

    seen = _force_prefill_splits(monkeypatch, splits)
    if splits == 1:
        _no_reduce(monkeypatch)
    T, G, H, D, L, P = 4, 2, 1, 64, 20, 16
    pools, table, gscale, _, _ = make_cache(Q.NVFP4, Q.ISO3, L, H, D, P, 5)
    q = np.random.default_rng(6).standard_normal((T, G * H, D)).astype(np.float32)
    out = cuda.to_device(np.full((T, G * H, D), np.nan, np.float32))
    out16 = cuda.to_device(np.full((T, G * H, D), 0x7FFF, np.uint16))
    (kc, ks), (vc, vs) = pools
    A.paged_attention_cuda(cuda.to_device(q), out, L - T, 0.125, Q.NVFP4, cuda.to_device(kc), cuda.to_device(ks),
                           Q.ISO3, cuda.to_device(vc), cuda.to_device(vs), cuda.to_device(gscale),
                           cuda.to_device(table), A.AttentionWorkspace(64, T, G * H, D), check_cold=False,
                           out16=out16, out16_fp16=f16, **_kernel_kw("mma_fa"))
    assert seen == [splits]
    want = out.copy_to_host().astype(np.float16 if f16 else ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(out16.copy_to_host(), want)


@pytest.mark.gpu
@pytest.mark.parametrize("kname,vname", [("bf16", "bf16"), ("nvfp4", "int8")])
def test_gpu_fa_prefill_unsplit_and_split_match_reference(monkeypatch, kname, vname):
    """A chunk whose grid fills the GPU (2304 tokens x 8 kv heads of G 2: 576 blocks) runs unsplit
    (plan_prefill with the kernel's resident blocks) and writes its output directly; it and the
    same chunk split 4 ways and merged by the reduce are both within the kernel's bound of the
    reference. (They differ from each other by more than fp32 order: each split rescales its
    own running maximum, so the p rounded to 16 bits for the PV product differ.)"""
    kf, vf, G, H, D, P, T, L = FMTS[kname], FMTS[vname], 2, 8, 128, 64, 2304, 3000
    pools, table, gscale, kd, vd = make_cache(kf, vf, L, H, D, P, 31)
    (kc, ks), (vc, vs) = pools
    dev = [cuda.to_device(x) for x in (kc, ks, vc, vs, gscale, table)]
    q = np.random.default_rng(32).standard_normal((T, G * H, D)).astype(np.float32)
    ws = A.AttentionWorkspace(4, T, G * H, D)
    sm = 1 / math.sqrt(D)
    refs = references(q, kd, vd, L - T, sm, kf, vf, "mma")
    for forced in (None, 4):
        with monkeypatch.context() as mp:
            seen = _force_prefill_splits(mp, forced) if forced else []
            if not forced:
                _no_reduce(mp)
            out = cuda.to_device(np.full((T, G * H, D), np.nan, np.float32))
            A.paged_attention_cuda(cuda.to_device(q), out, L - T, sm, kf, dev[0], dev[1], vf, dev[2], dev[3],
                                   dev[4], dev[5], ws, check_cold=False, kernel="mma")
            check(out.copy_to_host(), *refs)
            assert seen == ([4] if forced else [])


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS + ["mma_tok"])
@pytest.mark.parametrize("kname,vname", [("nvfp4", "nvfp4"), ("bf16", "int8")])
def test_gpu_prefill_large_vs_sdpa(kname, vname, kernel):
    kf, vf = FMTS[kname], FMTS[vname]
    T, L, H, G, D, P = 300, 5000, 2, 4, 128, 64
    pools, table, gscale, kd, vd = make_cache(kf, vf, L, H, D, P, 3)
    q = np.random.default_rng(4).standard_normal((T, G * H, D)).astype(np.float32)
    ws = A.AttentionWorkspace(1024, T, G * H, D)
    out = cuda.to_device(np.full((T, G * H, D), np.nan, np.float32))
    (kc, ks), (vc, vs) = pools
    sm = 1 / math.sqrt(D)
    A.paged_attention_cuda(cuda.to_device(q), out, L - T, sm, kf, cuda.to_device(kc), cuda.to_device(ks), vf,
                           cuda.to_device(vc), cuda.to_device(vs), cuda.to_device(gscale), cuda.to_device(table), ws,
                           **_kernel_kw(kernel))
    got = out.copy_to_host()
    ref, ref32, extra = references(q, kd, vd, L - T, sm, kf, vf, kernel)
    check(got, ref, ref32, extra)
    # torch SDPA (float32 on the GPU; TF32 off by default for matmul in SDPA math/mem-efficient paths)
    sd = _sdpa(q, kd, vd, L - T, sm)
    assert np.abs(sd - ref).max() < 5e-3 and np.abs(got - sd).max() < 5e-3 + np.max(extra)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS + ["mma_bulk", "mma_tm", "mma_tm_t4"])
def test_gpu_decode_vs_sdpa_long(kernel):
    G, H, D, L, P = 4, 8, 128, 131072 + 5, 64
    pools, table, gscale, kd, vd = make_cache(Q.NVFP4, Q.NVFP4, L, H, D, P, 9)
    q = np.random.default_rng(10).standard_normal((1, G * H, D)).astype(np.float32)
    ws = A.AttentionWorkspace(4096, 1, G * H, D)
    out = cuda.to_device(np.full((1, G * H, D), np.nan, np.float32))
    (kc, ks), (vc, vs) = pools
    sm = 1 / math.sqrt(D)
    A.paged_attention_cuda(cuda.to_device(q), out, L - 1, sm, Q.NVFP4, cuda.to_device(kc), cuda.to_device(ks),
                           Q.NVFP4, cuda.to_device(vc), cuda.to_device(vs), cuda.to_device(gscale),
                           cuda.to_device(table), ws, **_kernel_kw(kernel))
    got = out.copy_to_host()
    ref, ref32, extra = references(q, kd, vd, L - 1, sm, Q.NVFP4, Q.NVFP4, kernel)
    check(got, ref, ref32, extra)
    sd = _sdpa(q, kd, vd, L - 1, sm)
    assert np.abs(got - sd).max() < 5e-3 + np.max(extra)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS + ["mma_bulk", "mma_tm_t4"])
def test_gpu_device_position_mode(kernel):
    ws = A.AttentionWorkspace(4096, 1, 32, 128)
    for dgot, igot, *refs in _devpos_cases(Q.NVFP4, Q.NVFP4, 4, 128, 30000, 8, 64,
                                           [0, 63, 64, 4999, 29999], 131072, ws, 11, kernel):
        np.testing.assert_array_equal(dgot, igot)
        check(dgot, *refs)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS + ["mma_bulk"])
def test_gpu_device_position_cuda_graph(kernel):
    """Captured once as a CUDA graph (arguments frozen), replayed at several positions."""
    from cuda.bindings import driver as cu

    def ok(res):
        assert res[0] == cu.CUresult.CUDA_SUCCESS, res[0]
        return res[1] if len(res) > 1 else None

    G, H, D, L, P = 4, 2, 128, 5000, 64
    pools, table, gscale, kd, vd = make_cache(Q.INT8, Q.NVFP4, L, H, D, P, 12)
    (kc, ks), (vc, vs) = pools
    dev = [cuda.to_device(x) for x in (kc, ks, vc, vs, gscale, table)]
    q = np.random.default_rng(13).standard_normal((1, G * H, D)).astype(np.float32)
    qd, out = cuda.to_device(q), cuda.device_array((1, G * H, D), np.float32)
    pos_dev = cuda.to_device(np.array([L - 1], np.int32))
    ws = A.AttentionWorkspace(1024, 1, G * H, D)
    stream = cuda.stream()
    sm = 1 / math.sqrt(D)

    def launch():
        A.paged_attention_cuda(qd, out, pos_dev, sm, Q.INT8, dev[0], dev[1], Q.NVFP4, dev[2], dev[3], dev[4],
                               dev[5], ws, stream=stream, plan_len=8192, **_kernel_kw(kernel))

    launch()  # compile and load outside the capture
    stream.synchronize()
    s = cu.CUstream(int(stream.handle))
    ok(cu.cuStreamBeginCapture(s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
    launch()
    graph = ok(cu.cuStreamEndCapture(s))
    gexec = ok(cu.cuGraphInstantiate(graph, 0))
    try:
        for pos in (L - 1, 100, 2047, 0):
            pos_dev.copy_to_device(np.array([pos], np.int32))
            out.copy_to_device(np.full((1, G * H, D), np.nan, np.float32))
            ok(cu.cuGraphLaunch(gexec, s))
            stream.synchronize()
            check(out.copy_to_host(), *references(q, kd[: pos + 1], vd[: pos + 1], pos, sm, Q.INT8, Q.NVFP4, kernel))
    finally:
        cu.cuGraphExecDestroy(gexec)
        cu.cuGraphDestroy(graph)
