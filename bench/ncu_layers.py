"""The per-token kernels of bench/layers.py (one prefill chunk of the bundled model), each run twice, for ncu:
    python3 bench/ncu_layers.py rms_norm qkv_rope_append:nvfp4 swiglu [--tokens 8192]
(bash bench/ncu_stalls.sh --layers ... profiles the second run of each)."""
import argparse
import sys
from pathlib import Path

import numpy as np
from numba import cuda

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
import coldkv  # noqa: E402
from coldkv.numba_kernels import layers as L  # noqa: E402
from coldkv.runtime.loader import load_args  # noqa: E402
from layers import make_ops  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("ops", nargs="+", help="names of bench/layers.py's ops (qkv_rope_append:FORMAT, rms_norm, ...)")
ap.add_argument("--tokens", type=int, default=8192)
a = ap.parse_args()
formats = sorted({op.partition(":")[2] for op in a.ops if ":" in op} or {"nvfp4"})
ops = make_ops(load_args(coldkv.DEFAULT_MODEL), a.tokens, formats, 64, np.random.default_rng(0))
stream = cuda.stream()
for name in a.ops:
    for _ in range(2):
        ops[name][0](L, stream)
    stream.synchronize()
    print(name, "ran")
