"""The requant (or append / dequant) launch of bench/codecs.py on ~1 GiB, run twice, for ncu:
    python3 bench/ncu_codecs.py nvfp4 int8 [--op requant] [--pages 32768]
bench/ncu_stalls.sh --codecs nvfp4 int8 profiles the second launch of each format."""
import argparse
import os
import sys
from pathlib import Path

import numpy as np
from numba import cuda

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if os.environ.get("NUMBA_ENABLE_CUDASIM"):  # smoke run: the simulator lacks warp shuffles
    sys.path.insert(0, str(ROOT / "tests"))
    __import__("cudasim_warp").install()
from coldkv.numba_kernels import quant as Q  # noqa: E402
from coldkv.numba_kernels import requant as RQ  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("formats", nargs="+")
ap.add_argument("--op", default="requant", choices=["requant", "dequant"])
ap.add_argument("--pages", type=int, default=32768, help="64-token head-pages of the source pool")
ap.add_argument("--head-dim", type=int, default=128)
a = ap.parse_args()
P, D, n = 64, a.head_dim, a.pages
rng = np.random.default_rng(0)
for f in a.formats:
    fid = Q.FORMAT_IDS[f]
    xb = rng.standard_normal((4096, 1, D), dtype=np.float32)
    xb[:, :, 3] *= 8
    g = np.array([Q.global_scale_for(np.abs(xb).max() * 1.25)], np.float32)
    c0, s0 = Q.pool_arrays(f, 1, P, D)
    codes = cuda.device_array((n,) + c0.shape[1:], c0.dtype)
    scales = cuda.device_array((n,) + s0.shape[1:], s0.dtype)
    blk = 4096 // P  # fill the pool 64 pages at a time from the same random block
    tab = np.arange(n, dtype=np.int32).reshape(n // blk, 1, blk)
    d_x, d_g = cuda.to_device(xb), cuda.to_device(g)
    for i in range(n // blk):
        Q.launch_append(fid, d_x, 0, cuda.to_device(tab[i]), codes, scales, d_g)
    pages = cuda.to_device(rng.permutation(n).astype(np.int32))
    gs = cuda.to_device(np.full(n, g[0], np.float32))
    if a.op == "requant":
        oc0, os0 = Q.pool_arrays("c4g64", 1, P, D)
        oc = cuda.device_array((n,) + oc0.shape[1:], np.uint8)
        os_ = cuda.device_array((n,) + os0.shape[1:], np.uint8)
        og = cuda.device_array(n, np.float32)
        for _ in range(2):
            RQ.launch_requant_c4g64(fid, codes, scales, pages, gs, oc, os_, og)
    else:
        out = cuda.device_array((n, P, D), np.float32)
        for _ in range(2):
            Q.launch_dequant_pages(fid, codes, scales, pages, gs, out)
    cuda.synchronize()
    print(f, a.op, "ran", flush=True)
