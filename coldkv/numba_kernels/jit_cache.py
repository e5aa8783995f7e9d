"""`cached_njit`: numba's `njit(cache=True)` with data files named by their signature key.

Numba names a function's cached overloads `<name>.1.nbc`, `.2.nbc`, ... by their order in the
index. Two processes compiling different signatures of one function at the same time (pytest -n,
or two coldkv runs on a fresh install) both pick `.1.nbc`, and each index then points at the
other's machine code. Loading it, numba unboxes the arguments as the other signature's types and
checks only ndim and itemsize: seen on the H200 as "can't unbox array from PyObject" (pytest -n 4);
with two formats whose codes share an itemsize (int8 vs uint8) it would run on misread data.
Naming each file by a hash of its key makes a collision impossible; the index race that remains
only loses an entry (a recompile).

Where numba would cache next to the source (its in-tree `__pycache__`), the cache goes to numba's
user-wide cache directory instead: in a regular (non-editable) install that `__pycache__` is inside
site-packages, and `pip uninstall` leaves the cache files behind, so after `pip install -e .` a
`coldkv/` directory without `__init__.py` stays in site-packages and shadows the editable install
as a namespace package (the README's two quick-start commands in one environment failed so). A
cache directory set by the user (NUMBA_CACHE_DIR) is kept.

numba invalidates a cache when the function's own source file changes (its stamp: mtime and size),
not when a function it calls from another file does: after an edit of fp.py's scalar cores alone,
quant.py's cached kernels kept running the old cores (tests/test_jit_cache.py reproduces it). So
the stamp here also covers every .py file of the function's package folder (numba_kernels/: the
kernels and everything they call), by content.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from numba import njit
from numba.core.caching import IndexDataCacheFile, InTreeCacheLocator, UserWideCacheLocator


class _KeyedCacheFile(IndexDataCacheFile):
    def save(self, key, data):
        overloads = self._load_index()
        name = self._data_name_pattern.replace("{number:d}", hashlib.sha1(self._dump(key)).hexdigest()[:20])
        if overloads.get(key) != name:
            overloads[key] = name
            self._save_index(overloads)
        self._save_data(name, data)


@functools.lru_cache(maxsize=None)
def _folder_stamp(folder: str) -> str:
    """A hash of the contents of every .py file in `folder`: the sources a kernel there may call."""
    h = hashlib.sha1()
    for f in sorted(Path(folder).glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def keyed_cache(dispatcher):
    """Switch a `cache=True` dispatcher to key-named data files, out of the source tree, invalidated
    by a change to any source file of its package folder; returns it."""
    cache, impl = dispatcher._cache, dispatcher._cache._impl
    if isinstance(impl.locator, InTreeCacheLocator):
        user_wide = UserWideCacheLocator.from_function(dispatcher.py_func, impl.locator._py_file)
        if user_wide is not None:  # else (no writable user cache dir) numba's choice stays
            impl._locator = user_wide
            cache._cache_path = user_wide.get_cache_path()
    old = cache._cache_file
    folder = str(Path(dispatcher.py_func.__code__.co_filename).resolve().parent)
    cache._cache_file = _KeyedCacheFile(cache_path=cache._cache_path, filename_base=impl.filename_base,
                                        source_stamp=(old._source_stamp, _folder_stamp(folder)))
    return dispatcher


def cached_njit(**options):
    """`@cached_njit(fastmath=...)` == `@njit(cache=True, ...)` without the cross-process race."""
    return lambda f: keyed_cache(njit(cache=True, **options)(f))
