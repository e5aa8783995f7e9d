"""Run the CUDA backend's whole pass under Numba's CUDA simulator (no GPU) against the CPU backend.

    NUMBA_ENABLE_CUDASIM=1 python bench/sim_backend.py --table nvfp4 [--layers variants.layers_X] [--save F.npy]

Every kernel of the pass runs (embed, RMSNorm, the fused q/k/v + RoPE + page append and its
calibration, paged attention (the fp32 kernel: the simulator's choice), SwiGLU, the 16-bit
roundings, the LM head) except cuBLAS, whose contract (y (+)= x @ w^T, both bf16 or both fp16, in
fp32) a numpy stand-in keeps. A tiny random checkpoint (tests/tinymodel.py; Qwen3 by default,
--arch llama / qwen2 and the shape options make others), a 5-token prompt and 2 decode steps;
prints the logits' max |CUDA - CPU|, beside a quantized table's own effect on the CPU's logits
(max |table - bf16 KV|: K/V that differ by the GEMMs' bf16 rounding may take other codes, the
bound tests/test_cuda_backend.py uses), and whether the greedy tokens agree. --layers runs another
version of numba_kernels/layers.py (bench/ is on sys.path), --save keeps the logits, so two versions
can be compared bit for bit without a GPU. Slow: a Python thread per GPU thread, 3-10 min a run on
one core (session 17: max |diff| 0.035 with bf16 KV, 0.078 int8, 0.23 nvfp4, of logits up to 4.3;
greedy tokens equal; session 18's runs over Llama / Qwen2 / fp16 checkpoints:
bench/results/logs/sim_backend_session18.txt).
"""
from __future__ import annotations

import argparse
import importlib
import json
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
from tinymodel import make_checkpoint  # noqa: E402
from sim_stand_ins import NumpyGemm, sync_event  # noqa: E402
from benchutil import layers_today  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", default="nvfp4")
    ap.add_argument("--layers", default="", help="another version of numba_kernels/layers.py, e.g. variants.layers_X")
    ap.add_argument("--save", type=Path, help="write the CUDA backend's logits here (.npy)")
    ap.add_argument("--arch", default="qwen3", choices=["qwen3", "llama", "qwen2"])
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--heads", type=int, nargs=2, default=[4, 2], metavar=("Q", "KV"))
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--tie", action="store_true", help="tied embeddings")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"], help="the checkpoint's tensors "
                    "(f16: the CUDA backend runs fp16 GEMMs)")
    ap.add_argument("--rope", default="", help='rope_scaling as JSON, e.g. \'{"rope_type": "llama3", "factor": 8, '
                    '"low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 64}\'')
    a = ap.parse_args()
    CB.CublasGemm = NumpyGemm
    CB.cuda.event = sync_event
    if a.layers:
        CB.L = layers_today(importlib.import_module(a.layers))
        CB.L.MAX_ROW = getattr(CB.L, "MAX_ROW", 1 << 30)  # versions before session 17 had no row limit
    CB.L.GSCALE_SLICES = 4  # the calibration's 512 slices x 128 threads would be most of the run here
    ckpt = make_checkpoint(Path(tempfile.mkdtemp()) / "ckpt", a.arch, seed=3, head_dim=a.head_dim, heads=a.heads[0],
                           kv_heads=a.heads[1], hidden=a.hidden, tie=a.tie, rope=json.loads(a.rope) if a.rope else None,
                           bf16=a.dtype == "bf16", f16=a.dtype == "f16")
    seq, n_prompt = [5, 17, 33, 2, 9, 100, 7], 5
    t0 = time.perf_counter()

    def logits(backend, table_name: str) -> np.ndarray:
        table = resolve_table(table_name, backend.args.num_hidden_layers)
        cache = backend.new_cache(table, len(seq))
        rows = [backend.forward(np.array(seq[:n_prompt]), cache)]
        rows += [backend.forward(np.array([t]), cache) for t in seq[n_prompt:]]
        return np.stack(rows)

    cuda_logits = logits(CB.CUDABackend(ckpt, graphs=False), a.table)
    cpu = CPUBackend(ckpt)
    cpu_logits = logits(cpu, a.table)
    if a.save:
        np.save(a.save, cuda_logits)
    diff = float(np.abs(cuda_logits - cpu_logits).max())
    # K/V that differ by the GEMMs' bf16 rounding can take other 4-bit / int8 codes, so a quantized
    # table's CUDA-CPU difference is judged against the table's own effect on the CPU (as
    # tests/test_cuda_backend.py does); greedy choices must agree where the CPU's top-2 margin > 2 diff
    own = float(np.abs(cpu_logits - logits(cpu, "bf16")).max()) if a.table != "bf16" else 0.0
    top2 = np.sort(cpu_logits, axis=-1)[:, -2:]
    sure = top2[:, 1] - top2[:, 0] > 2 * diff
    agree = bool((cuda_logits.argmax(-1) == cpu_logits.argmax(-1))[sure].all())
    print(f"{a.arch} {a.dtype} d {a.head_dim} heads {a.heads} hidden {a.hidden}{' tied' if a.tie else ''}"
          f"{' rope ' + a.rope if a.rope else ''}, table {a.table}, layers {CB.L.__name__}: max |CUDA - CPU| {diff:.4g} "
          f"(max |logit| {np.abs(cpu_logits).max():.3g}; the table's own effect on the CPU {own:.4g}), greedy equal "
          f"{bool((cuda_logits.argmax(-1) == cpu_logits.argmax(-1)).all())} (where the CPU margin > 2 diff: {agree}, "
          f"{int(sure.sum())}/{len(sure)} rows), {time.perf_counter() - t0:.0f} s")

if __name__ == "__main__":
    main()
