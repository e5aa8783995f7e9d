"""`cached_njit`: numba's `njit(cache=True)` with data files named by their signature key.

Numba names a function's cached overloads `<name>.1.nbc`, `.2.nbc`, ... by their order in the
index. Two processes compiling different signatures of one function at the same time (pytest -n,
or two coldkv runs on a fresh install) both pick `.1.nbc`, and each index then points at the
other's machine code. Loading it, numba unboxes the arguments as the other signature's types and
checks only ndim and itemsize: seen on the H200 as "can't unbox array from PyObject" (pytest -n 4);
with two formats whose codes share an itemsize (int8 vs uint8) it would run on misread data.
Naming each file by a hash of its key makes a collision impossible; the index race that remains
only loses an entry (a recompile).
"""
from __future__ import annotations

import hashlib

from numba import njit
from numba.core.caching import IndexDataCacheFile


class _KeyedCacheFile(IndexDataCacheFile):
    def save(self, key, data):
        overloads = self._load_index()
        name = self._data_name_pattern.replace("{number:d}", hashlib.sha1(self._dump(key)).hexdigest()[:20])
        if overloads.get(key) != name:
            overloads[key] = name
            self._save_index(overloads)
        self._save_data(name, data)


def keyed_cache(dispatcher):
    """Switch a `cache=True` dispatcher to key-named data files; returns it."""
    cache_file = dispatcher._cache._cache_file
    cache_file.__class__ = _KeyedCacheFile
    return dispatcher


def cached_njit(**options):
    """`@cached_njit(fastmath=...)` == `@njit(cache=True, ...)` without the cross-process race."""
    return lambda f: keyed_cache(njit(cache=True, **options)(f))
