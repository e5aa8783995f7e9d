"""Compile every CUDA kernel to PTX for sm_90 (catches typing the simulator lets through).

Runs tests/ptx_check.py in a subprocess without NUMBA_ENABLE_CUDASIM: this process may already
have imported numba.cuda as the simulator. A kernel module in coldkv.numba_kernels.KERNEL_MODULES
is checked (MODULE:I/N in PTX_MODULES: a shard of a long list, so that CI's two workers compile it
side by side).
The kernel modules with many builds list the runtime's and one of each code path in
PTX_SIGNATURES, and the benchmark's other variants in PTX_SIGNATURES_MORE, compiled with -m slow
(CI's time: each takes 3-8 s of one core). Before a device call run both: `pytest
tests/test_ptx.py -m "slow or not slow"`.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coldkv.numba_kernels import KERNEL_MODULES

ROOT = Path(__file__).resolve().parents[1]
_SHARDS = {"attention_prefill": 4, "attention_mma": 2}  # ~225 / ~100 s on one core: short shards pack better
PTX_MODULES = [f"coldkv.numba_kernels.{m}" + (f":{i}/{n}" if n > 1 else "")
               for m in KERNEL_MODULES for n in [_SHARDS.get(m, 1)] for i in range(n)]


PTX_MORE = [f"coldkv.numba_kernels.{m}=PTX_SIGNATURES_MORE" for m in ("attention_cuda", "attention_mma")]
PTX_MORE += [f"coldkv.numba_kernels.attention_prefill=PTX_SIGNATURES_MORE:{i}/2" for i in range(2)]


@pytest.mark.parametrize("module", PTX_MODULES + [pytest.param(m, marks=pytest.mark.slow) for m in PTX_MORE])
def test_kernels_compile_to_ptx(module):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "ptx_check.py"), module],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kernels to PTX for sm_90" in proc.stdout
