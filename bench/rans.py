"""rANS cold slots: sizes against entropy and raw formats (CPU), decode/encode throughput (GPU).

Validate, then measure; writes JSON (command, device, versions, commit, shapes, numbers).
    python bench/rans.py --out bench/results/rans.json [--commit HASH] [--gpu-symbols 1.07e9]
Size data: Gaussian, Laplace and outlier-channel values quantized by coldkv.codecs.quantize.
Throughput: the restore kernel (a warp per slot) on >= 1 G code symbols, next to a raw copy and a
raw nibble-unpack kernel over the same pages in the same run; all times are CUDA-event medians.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
from numba import cuda, uint32

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchutil import git_commit, lead_timed  # noqa: E402
from coldkv.codecs import decode_cold_page, encode_cold_page, quantize, rans_encode  # noqa: E402
from coldkv.codecs.slots import pack_pool, slot_alloc_bytes  # noqa: E402
from coldkv.numba_kernels import rans as K  # noqa: E402

TOKENS = 64
KINDS = ("gaussian", "laplace", "outlier")


def values(kind: str, tokens: int, head_dim: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "gaussian":
        return rng.standard_normal((tokens, head_dim)).astype(np.float32)
    if kind == "laplace":
        return rng.laplace(size=(tokens, head_dim)).astype(np.float32)
    x = rng.standard_normal((tokens, head_dim)).astype(np.float32)  # outlier channels, as real K
    ch = rng.choice(head_dim, max(1, head_dim // 32), replace=False)
    x[:, ch] *= rng.uniform(10, 30, ch.size).astype(np.float32)
    return x


def entropy_bytes(s: np.ndarray, alphabet: int) -> float:
    c = np.bincount(s, minlength=alphabet) / s.size
    c = c[c > 0]
    return float(-(c * np.log2(c)).sum() * s.size / 8)


def nibbles(codes: np.ndarray) -> np.ndarray:
    return np.stack([codes & 15, codes >> 4], -1).reshape(-1)


# ------------------------------------------------------------------------------------ sizes

def size_results(n_pages: int) -> dict:
    streams = []
    for kind in KINDS:
        for head_dim in (64, 128, 256):
            rng = np.random.default_rng(head_dim)
            tot_h = tot_b = 0.0
            for _ in range(n_pages):
                s = nibbles(quantize(values(kind, TOKENS, head_dim, rng), "c4g64").codes)
                tot_h += entropy_bytes(s, 16)
                tot_b += len(rans_encode(s, 16))
            streams.append(dict(kind=kind, symbols=TOKENS * head_dim, order0_entropy_bytes=tot_h / n_pages,
                                coded_bytes=tot_b / n_pages, overhead_pct=100 * (tot_b / tot_h - 1)))
    pages = []
    for fmt in ("c4g64", "nvfp4", "iso3"):
        for kind in KINDS:
            for head_dim in (64, 128, 256):
                rng = np.random.default_rng(1000 + head_dim)
                raw = slot = alloc = coded = 0
                for _ in range(n_pages):
                    p = quantize(values(kind, TOKENS, head_dim, rng), fmt)
                    blob = encode_cold_page(p)
                    assert decode_cold_page(blob).equal(p)
                    raw += p.nbytes
                    slot += len(blob)
                    alloc += slot_alloc_bytes(blob)
                    coded += blob[3] & K.F_CODED
                n_vals = n_pages * TOKENS * head_dim
                pages.append(dict(
                    fmt=fmt, kind=kind, head_dim=head_dim, raw_bytes=raw / n_pages, slot_bytes=slot / n_pages,
                    alloc_bytes=alloc / n_pages, coded_fraction=coded / n_pages,
                    bits_per_value_raw=8 * raw / n_vals, bits_per_value_alloc=8 * alloc / n_vals,
                    raw_c4g64_bits=8 * (TOKENS * head_dim // 2 + TOKENS * head_dim // 64 + 4) / (TOKENS * head_dim),
                    raw_nvfp4_bits=8 * (TOKENS * head_dim // 2 + TOKENS * head_dim // 16 + 4) / (TOKENS * head_dim),
                    alloc_vs_raw=alloc / raw))
    return dict(streams=streams, pages=pages, pages_per_cell=n_pages, tokens=TOKENS)


def cpu_speed(head_dim: int = 128, n_pages: int = 256) -> dict:
    rng = np.random.default_rng(7)
    pages = [quantize(values(KINDS[i % 3], TOKENS, head_dim, rng), "c4g64") for i in range(n_pages)]
    encode_cold_page(pages[0])
    t0 = time.perf_counter()
    blobs = [encode_cold_page(p) for p in pages]
    t1 = time.perf_counter()
    for b in blobs:
        decode_cold_page(b)
    t2 = time.perf_counter()
    sym = n_pages * TOKENS * head_dim
    return dict(pages=n_pages, head_dim=head_dim, encode_gsym_per_s=sym / (t1 - t0) / 1e9,
                decode_gsym_per_s=sym / (t2 - t1) / 1e9, note="one CPU thread, njit, incl. Python per-page calls")


# ------------------------------------------------------------------------------------ GPU

def gpu_results(target_symbols: float, reps: int, distinct: int = 256, n_encode: int = 16384) -> dict:
    head_dim = 128
    n_codes, n_scales = TOKENS * head_dim // 2, TOKENS * head_dim // 64
    sym_per_page = 2 * n_codes

    @cuda.jit
    def raw_copy(src, dst):  # src/dst uint32[P, n_codes // 4]
        p, k = cuda.grid(2)
        if p < src.shape[0] and k < src.shape[1]:
            dst[p, k] = src[p, k]

    @cuda.jit
    def raw_unpack(src, dst):  # uint32[P, n_codes // 4] -> one byte per nibble, uint32[P, n_codes // 2]
        p, k = cuda.grid(2)
        if p < src.shape[0] and k < src.shape[1]:
            w = src[p, k]
            for half in range(2):
                v = w >> uint32(16 * half)
                dst[p, 2 * k + half] = ((v & uint32(0xF)) | (((v >> uint32(4)) & uint32(0xF)) << uint32(8))
                                        | (((v >> uint32(8)) & uint32(0xF)) << uint32(16))
                                        | (((v >> uint32(12)) & uint32(0xF)) << uint32(24)))

    warps8 = 8

    @cuda.jit
    def restore8(pool16, offs, nbytes, codes, scales, status):  # restore with 8 warps per block
        tab_all = cuda.shared.array((warps8, 1024), np.uint32)
        h = cuda.local.array(9, np.int64)
        w = cuda.threadIdx.x // 32
        p = cuda.blockIdx.x * warps8 + w
        if p >= offs.shape[0]:
            return
        err = K.warp_decode_page(pool16, offs[p], nbytes[p], codes[p], 0, codes.shape[1], scales[p], 0,
                                 scales.shape[1], h, tab_all[w])
        if cuda.laneid == 0:
            status[p] = err

    @cuda.jit
    def decode_to_shared(pool16, offs, nbytes, status):  # inline use: decode into shared memory only
        tab_all = cuda.shared.array((4, 1024), np.uint32)
        codes = cuda.shared.array((4, 4096), np.uint8)
        scales = cuda.shared.array((4, 128), np.uint8)
        h = cuda.local.array(9, np.int64)
        w = cuda.threadIdx.x // 32
        p = cuda.blockIdx.x * 4 + w
        if p >= offs.shape[0]:
            return
        err = K.warp_decode_page(pool16, offs[p], nbytes[p], codes[w], 0, 4096, scales[w], 0, 128, h, tab_all[w])
        cuda.syncwarp(0xFFFFFFFF)
        if cuda.laneid == 0:
            status[p] = err + codes[w, 4095] * 0

    def timed(launch, n=reps):
        """Median ms and the runs (benchutil.lead_timed: the host's launch cost is not timed)."""
        ms, ts, _ = lead_timed(launch, n)
        return ms, ts

    out = dict(head_dim=head_dim, tokens=TOKENS, symbols_per_page=sym_per_page, runs={})
    for kind in KINDS + ("mixed",):
        rng = np.random.default_rng(99)
        pages = [quantize(values(kind if kind != "mixed" else KINDS[i % 3], TOKENS, head_dim, rng), "c4g64")
                 for i in range(distinct)]
        blobs = [encode_cold_page(p) for p in pages]
        reps_tile = int(np.ceil(target_symbols / sym_per_page / distinct))
        n = distinct * reps_tile
        pool16, offs, alloc = pack_pool(blobs)
        span = pool16.size - 1  # words per tile (pack_pool adds one spare word)
        big = np.tile(pool16[:span], reps_tile)
        big = np.concatenate([big, np.zeros(8, np.uint16)])
        offs_all = (offs[None, :] + span * np.arange(reps_tile)[:, None]).reshape(-1).astype(np.int64)
        alloc_all = np.tile(alloc, reps_tile).astype(np.int32)
        d_pool, d_offs, d_alloc = cuda.to_device(big), cuda.to_device(offs_all), cuda.to_device(alloc_all)
        d_codes = cuda.device_array((n, n_codes), np.uint8)
        d_scales = cuda.device_array((n, n_scales), np.uint8)
        d_g = cuda.device_array(n, np.uint32)
        d_st = cuda.device_array(n, np.int32)
        grid4 = (n + K.RESTORE_WARPS - 1) // K.RESTORE_WARPS

        def restore4():
            K.restore_pages_kernel[grid4, 32 * K.RESTORE_WARPS](d_pool, d_offs, d_alloc, d_codes, d_scales, d_g, d_st)

        # validate before timing: every tile decodes to the pages
        restore4()
        st = d_st.copy_to_host()
        assert (st == 0).all(), np.unique(st)
        chk = np.unique([0, n // 2, n - 1])
        got = d_codes.copy_to_host()[chk]
        for row, i in zip(got, chk):
            assert np.array_equal(row, pages[i % distinct].codes.ravel())
        t4, ts4 = timed(restore4)

        def restore_8():
            restore8[(n + warps8 - 1) // warps8, 32 * warps8](d_pool, d_offs, d_alloc, d_codes, d_scales, d_st)

        t8, _ = timed(restore_8)

        def shared_only():
            decode_to_shared[(n + 3) // 4, 128](d_pool, d_offs, d_alloc, d_st)

        ts_, _ = timed(shared_only)
        assert (d_st.copy_to_host() == 0).all()
        del d_codes, d_scales
        # raw baselines over the same number of pages (raw c4g64 codes, tiled the same way)
        raw = np.stack([p.codes.ravel() for p in pages]).view(np.uint32)
        d_raw = cuda.to_device(np.tile(raw, (reps_tile, 1)))
        d_copy = cuda.device_array_like(d_raw)
        d_unp = cuda.device_array((n, raw.shape[1] * 2), np.uint32)
        g2 = ((n + 3) // 4, (raw.shape[1] + 63) // 64)
        tc, _ = timed(lambda: raw_copy[g2, (4, 64)](d_raw, d_copy))
        tu, _ = timed(lambda: raw_unpack[g2, (4, 64)](d_raw, d_unp))
        u = d_unp[: 2].copy_to_host().view(np.uint8)
        assert np.array_equal(u[0], nibbles(pages[0].codes)) and np.array_equal(u[1], nibbles(pages[1].codes))
        del d_raw, d_copy, d_unp, d_pool
        sym = n * sym_per_page
        out["runs"][kind] = dict(
            pages=n, symbols=sym, coded_fraction=float(np.mean([b[3] & K.F_CODED for b in blobs])),
            slot_bytes_per_page=float(np.mean([len(b) for b in blobs])),
            restore_ms=t4, restore_ms_all=ts4, restore_gsym_per_ms=sym / t4 / 1e9,
            restore_8warps_gsym_per_ms=sym / t8 / 1e9, decode_to_shared_gsym_per_ms=sym / ts_ / 1e9,
            raw_copy_gsym_per_ms=sym / tc / 1e9, raw_unpack_gsym_per_ms=sym / tu / 1e9,
            raw_unpack_over_restore=t4 / tu,
            slot_read_gbs=float(alloc.sum() * reps_tile / (t4 * 1e-3) / 1e9))
    # encoder kernel: one thread per page
    rng = np.random.default_rng(5)
    pages = [quantize(values(KINDS[i % 3], TOKENS, head_dim, rng), "c4g64") for i in range(distinct)]
    ne = n_encode
    codes = np.tile(np.stack([p.codes.ravel() for p in pages]), (ne // distinct, 1))
    scales = np.tile(np.stack([p.scales.ravel() for p in pages]), (ne // distinct, 1))
    gb = np.tile(np.array([np.float32(p.global_scale).view(np.uint32) for p in pages]), ne // distinct)
    d_c, d_s, d_gb = cuda.to_device(codes), cuda.to_device(scales), cuda.to_device(gb)
    d_o = cuda.device_array((ne, K.slot_capacity(n_codes, n_scales)), np.uint8)
    d_l = cuda.device_array(ne, np.int32)
    for threads in (32, 64, 128):
        te, _ = timed(lambda: K.encode_pages_kernel[(ne + threads - 1) // threads, threads](
            d_c, d_s, d_gb, 4, TOKENS, head_dim, d_o, d_l), n=3)
        out.setdefault("encode", {})[f"threads_{threads}"] = dict(
            pages=ne, ms=te, gsym_per_ms=ne * sym_per_page / te / 1e9)
    lens = d_l.copy_to_host()
    o = d_o.copy_to_host()
    for i in sorted({0, 1, ne // 2, ne - 1}):
        assert o[i, : lens[i]].tobytes() == encode_cold_page(pages[i % distinct])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/rans.json")
    ap.add_argument("--commit", default="")
    ap.add_argument("--size-pages", type=int, default=16)
    ap.add_argument("--gpu-symbols", type=float, default=2**30)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--distinct", type=int, default=256, help="distinct pages, tiled to --gpu-symbols")
    ap.add_argument("--encode-pages", type=int, default=16384)
    args = ap.parse_args()
    import numba

    commit = git_commit(args.commit)
    res = dict(command=" ".join(["python"] + sys.argv), commit=commit, python=platform.python_version(),
               numpy=np.__version__, numba=numba.__version__)
    try:
        import numba_cuda

        res["numba_cuda"] = getattr(numba_cuda, "__version__", "?")
    except ImportError:
        pass
    res["device"] = "cpu only"
    if cuda.is_available():
        name = getattr(cuda.get_current_device(), "name", b"CUDA simulator")
        res["device"] = name.decode() if isinstance(name, bytes) else str(name)
    t = time.time()
    res["sizes"] = size_results(args.size_pages)
    res["cpu_speed"] = cpu_speed()
    print(f"sizes + cpu done in {time.time() - t:.1f} s", flush=True)
    if cuda.is_available():
        t = time.time()
        res["gpu"] = gpu_results(args.gpu_symbols, args.reps, args.distinct, args.encode_pages)
        print(f"gpu done in {time.time() - t:.1f} s", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "sizes"}, indent=1)[:6000])


if __name__ == "__main__":
    main()
