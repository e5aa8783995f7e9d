"""Set the thread count of the OpenBLAS numpy uses (the CPU backend's GEMMs).

On a loaded or small machine, OpenBLAS's worker threads wait on each other: measured on a shared
2-core box, decode of the bundled 17M model took 250-700 ms/token with 2 BLAS threads and 9-15 ms
with 1. `coldkv generate --threads N` uses this. Works with the OpenBLAS that numpy wheels bundle
(found among the loaded libraries); with another BLAS it reports that it cannot set the count.
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager
from collections.abc import Iterator
from pathlib import Path

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads")


def _openblas() -> tuple[object, object] | None:
    """(set, get) functions of the loaded OpenBLAS, or None."""
    import numpy  # noqa: F401  (loads numpy's BLAS)

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "openblas" in line.lower() and "/" in line})
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, n) for n in _SETTERS if hasattr(lib, n)), None)
        getter = next((getattr(lib, n) for n in _GETTERS if hasattr(lib, n)), None)
        if setter is not None and getter is not None:
            getter.restype = ctypes.c_int
            return setter, getter
    return None


def get_threads() -> int | None:
    fns = _openblas()
    return None if fns is None else int(fns[1]())


def set_threads(n: int) -> bool:
    """Set OpenBLAS to n threads; False when numpy's BLAS is not an OpenBLAS we can find."""
    fns = _openblas()
    if fns is None:
        return False
    fns[0](ctypes.c_int(n))
    return True


@contextmanager
def blas_threads(n: int | None) -> Iterator[None]:
    """Run a block with n BLAS threads (None: leave as is), restoring the count after."""
    before = get_threads() if n else None
    if n and before is not None:
        set_threads(n)
    try:
        yield
    finally:
        if n and before is not None:
            set_threads(before)
