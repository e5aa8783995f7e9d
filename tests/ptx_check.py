"""Compile every CUDA kernel of the given modules to PTX for sm_90, without a GPU.

Run in its own process (the test suite may be running under the CUDA simulator):
    python tests/ptx_check.py coldkv.numba_kernels.quant ...
Each module lists what to compile in `PTX_SIGNATURES = [(kernel_or_device_fn, "sig"), ...]`;
MODULE=LIST compiles the module's list LIST instead (PTX_SIGNATURES_MORE: the builds CI leaves
to -m slow), and MODULE:I/N its entries I, I + N, ... only (a shard: CI's two workers share a
long list).
"""
from __future__ import annotations

import importlib
import sys


class _Sm90:
    compute_capability = (9, 0)


def main(modules: list[str]) -> int:
    from numba import cuda
    import numba.cuda.dispatcher as dispatcher

    # Kernels that call device functions ask the current device for its compute capability.
    dispatcher.get_current_device = lambda: _Sm90()
    failures = 0
    count = 0
    for spec in modules:
        name, _, shard = spec.partition(":")
        name, _, listing = name.partition("=")
        i, n = map(int, shard.split("/")) if shard else (0, 1)
        module = importlib.import_module(name)
        for fn, sig in getattr(module, listing or "PTX_SIGNATURES", [])[i::n]:
            count += 1
            device = fn.targetoptions.get("device", False)
            try:
                cuda.compile_ptx(fn.py_func, sig, cc=(9, 0), device=bool(device))
            except Exception as exc:  # report every failure, then fail once
                failures += 1
                print(f"FAIL {name}.{fn.py_func.__name__} {sig}: {type(exc).__name__}: {exc}")
    print(f"compiled {count - failures}/{count} kernels to PTX for sm_90")
    return 1 if failures or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
