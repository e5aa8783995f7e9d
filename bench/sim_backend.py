"""Run the CUDA backend's whole pass under Numba's CUDA simulator (no GPU) against the CPU backend.

    NUMBA_ENABLE_CUDASIM=1 python bench/sim_backend.py --table nvfp4 [--layers variants.layers_X] [--save F.npy]

Every kernel of the pass runs (embed, RMSNorm, the fused q/k/v + RoPE + page append and its
calibration, paged attention (the fp32 kernel: the simulator's choice), SwiGLU, the bf16 roundings,
the LM head) except cuBLAS, whose contract (y (+)= bf16(x) @ bf16(w)^T in fp32) a numpy stand-in
keeps. A tiny random Qwen3 checkpoint (tests/tinymodel.py), a 5-token prompt and 2 decode steps;
prints the logits' max |CUDA - CPU| and whether the greedy tokens agree. --layers runs another
version of numba_kernels/layers.py (bench/ is on sys.path), --save keeps the logits, so two versions
can be compared bit for bit without a GPU. Slow: a Python thread per GPU thread, 3-10 min a run on
one core (session 17: max |diff| 0.035 with bf16 KV, 0.078 int8, 0.23 nvfp4, of logits up to 4.3;
greedy tokens equal).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

if not os.environ.get("NUMBA_ENABLE_CUDASIM"):
    sys.exit("run it under the simulator: NUMBA_ENABLE_CUDASIM=1 python bench/sim_backend.py ...")
__import__("cudasim_warp").install()  # warp shuffles for the simulator

import numpy as np  # noqa: E402

from coldkv.runtime import cuda_backend as CB  # noqa: E402
from coldkv.runtime.backend import CPUBackend  # noqa: E402
from coldkv.runtime.kv_table import resolve_table  # noqa: E402
from coldkv.runtime.safetensors_io import bf16_bits_to_f32  # noqa: E402
from tinymodel import make_checkpoint  # noqa: E402


class NumpyGemm:
    """cuBLAS's contract on the simulator's host-backed arrays: y (+)= bf16(x) @ bf16(w)^T, fp32 out."""

    def __init__(self, stream):
        pass

    def __call__(self, x, w, y, accumulate: bool = False) -> None:
        r = (bf16_bits_to_f32(x.copy_to_host()).astype(np.float64)
             @ bf16_bits_to_f32(w.copy_to_host()).astype(np.float64).T).astype(np.float32)
        y.copy_to_device(r + y.copy_to_host() if accumulate else r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", default="nvfp4")
    ap.add_argument("--layers", default="", help="another version of numba_kernels/layers.py, e.g. variants.layers_X")
    ap.add_argument("--save", type=Path, help="write the CUDA backend's logits here (.npy)")
    a = ap.parse_args()
    CB.CublasGemm = NumpyGemm
    if a.layers:
        CB.L = importlib.import_module(a.layers)
        CB.L.MAX_ROW = getattr(CB.L, "MAX_ROW", 1 << 30)  # versions before session 17 had no row limit
    CB.L.GSCALE_SLICES = 4  # the calibration's 512 slices x 128 threads would be most of the run here
    ckpt = make_checkpoint(Path(tempfile.mkdtemp()) / "ckpt", "qwen3", seed=3)
    seq, n_prompt = [5, 17, 33, 2, 9, 100, 7], 5
    out = []
    t0 = time.perf_counter()
    for backend in (CB.CUDABackend(ckpt, graphs=False), CPUBackend(ckpt)):
        table = resolve_table(a.table, backend.args.num_hidden_layers)
        cache = backend.new_cache(table, len(seq))
        rows = [backend.forward(np.array(seq[:n_prompt]), cache)]
        rows += [backend.forward(np.array([t]), cache) for t in seq[n_prompt:]]
        out.append(np.stack(rows))
    cuda_logits, cpu_logits = out
    if a.save:
        np.save(a.save, cuda_logits)
    print(f"table {a.table}, layers {CB.L.__name__}: max |CUDA - CPU| {np.abs(cuda_logits - cpu_logits).max():.4g} "
          f"(max |logit| {np.abs(cpu_logits).max():.3g}), greedy equal "
          f"{bool((cuda_logits.argmax(-1) == cpu_logits.argmax(-1)).all())}, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
