"""Disk caches of compiled kernels that processes can share safely: `cached_njit` (CPU) and
`cuda_kernel` (GPU), numba's own caches with the four defects below fixed.

Numba names a function's cached overloads `<name>.1.nbc`, `.2.nbc`, ... by their order in the
index. Two processes compiling different signatures of one function at the same time (pytest -n,
or two coldkv runs on a fresh install) both pick `.1.nbc`, and each index then points at the
other's machine code. Loading it, numba unboxes the arguments as the other signature's types and
checks only ndim and itemsize: seen on the H200 as "can't unbox array from PyObject" (pytest -n 4);
with two formats whose codes share an itemsize (int8 vs uint8) it would run on misread data.
Naming each file by a hash of its key makes a collision impossible; the index race that remains
only loses an entry (a recompile). A save that finds the index written by another numba or for
other sources deletes the function's old data files, so the cache does not grow with every edit
or upgrade.

Where numba would cache next to the source (its in-tree `__pycache__`), the cache goes to numba's
user-wide cache directory instead: in a regular (non-editable) install that `__pycache__` is inside
site-packages, and `pip uninstall` leaves the cache files behind, so after `pip install -e .` a
`coldkv/` directory without `__init__.py` stays in site-packages and shadows the editable install
as a namespace package (the README's two quick-start commands in one environment failed so). A
cache directory set by the user (NUMBA_CACHE_DIR) is kept.

numba invalidates a cache when the function's own source file changes (its stamp: mtime and size),
not when a function it calls from another file does: after an edit of fp.py's scalar cores alone,
quant.py's cached kernels kept running the old cores (tests/test_jit_cache.py reproduces it). So
the stamp here is every .py file of the function's package folder (numba_kernels/: the kernels
and everything they call), by content: a reinstall or a copy of the same sources (new mtimes)
keeps the cache, any edit there drops it.

CUDA kernels (`cuda_kernel`): numba-cuda's cache has the same three defects and a fourth. Its
index key hashes a kernel's closure by pickling the cell contents, and for kernels built by a
factory (attention_mma._build, ...) the pickle of the device functions they capture differs from
process to process: every run missed and wrote one more data file (measured offline: two runs
of one decode kernel, two `.nbc` files, 3 s of compile each). Its key also leaves out the jit
options (max_registers). Here the key holds a fingerprint of everything a kernel's code is
built from: its bytecode, closure values and the globals it reads, recursively through the device
functions and intrinsics it calls (numba's own functions by name: its version is in the key). An
object the fingerprint cannot name stably turns the cache off for that kernel rather than risk a
wrong hit.
Saving or loading an entry never fails a run: a miss compiles.

Processes that miss the same entry at once (pytest -n's workers on a fresh machine, two coldkv
runs after an install) would each compile it, side by side (the gpu suite's backend tests took
100-260 s each at -n 12, where one fresh `coldkv generate --device cuda` compiles in ~16-24 s).
So a miss claims the entry (an exclusive lock file beside it) for as long as its compile runs; a
process that finds the entry claimed waits for the claim to end, then loads what the other
process saved. A claim ends when its compile returns or raises
(`_claims_end_with`), or when its process dies (the lock is the OS's); a wait that outlasts
CLAIM_WAIT_S compiles anyway.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import time
import types
from pathlib import Path

import numpy as np
from numba import config, njit
from numba.core.caching import IndexDataCacheFile, InTreeCacheLocator, UserWideCacheLocator


_compile_listeners: list = []  # called with a function's cache name before it compiles (compile_notices)


@contextlib.contextmanager
def compile_notices(callback):
    """Within the block, callback(name) runs whenever a cached kernel (CPU or CUDA) misses its disk
    cache and is about to compile (the CLI tells the user why the first run waits)."""
    _compile_listeners.append(callback)
    try:
        yield
    finally:
        _compile_listeners.remove(callback)


@contextlib.contextmanager
def _index_lock(index_path: str):
    """An exclusive lock on an index's read-add-write, so that processes adding entries to one
    index at once (a benchmark's compile workers, pytest -n) all keep theirs: unlocked, each reads
    the index, adds its key and writes it back, the last write drops the others' entries, and
    their kernels compile again in the next process. Unlocked where it cannot be taken (no fcntl,
    a read-only cache directory): an entry lost costs a compile, never a wrong load."""
    try:
        import fcntl

        f = open(index_path + ".lock", "ab")
    except (ImportError, OSError):
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when f closes
        yield


CLAIM_WAIT_S = 300.0  # longest wait for another process's compile of an entry; then compile here
_claims: list = []  # [lock path, open lock file or None], this process's claimed entries, innermost last


def _claim(path: str, reload):
    """Claim the entry whose lock file is `path`: wait while another process holds it, then
    reload(); -> the entry it saved, or None with the claim taken (this process compiles). Where no
    lock can be had (no fcntl, a read-only cache directory, a wait past CLAIM_WAIT_S): None, unclaimed."""
    if any(p == path for p, _ in _claims):  # claimed here already (a compile that failed, tried again)
        return None
    try:
        import fcntl

        f = open(path, "ab")
    except (ImportError, OSError):
        return None
    deadline = time.monotonic() + CLAIM_WAIT_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                return None
            time.sleep(0.05)
        except OSError:
            f.close()
            return None
    data = reload()
    if data is not None:  # the other process's compile, saved
        f.close()
        return data
    _claims.append([path, f])
    return None


def _end_claim(path: str) -> None:
    """The entry is saved: let the processes waiting for it load it."""
    for claim in _claims:
        if claim[0] == path and claim[1] is not None:
            claim[1].close()
            claim[1] = None


def _claims_end_with(dispatcher):
    """Make the claims a compile of `dispatcher` takes end when that compile returns or raises (a
    failed compile saves nothing, and its process may live on: tests that expect the error); ->
    dispatcher. Its `compile` is what numba calls on a miss (`_compile_for_args`, typing a call
    from another jitted function, a launch)."""
    compile_ = dispatcher.compile

    @functools.wraps(compile_)
    def compile(*args, **kwargs):
        depth = len(_claims)
        try:
            return compile_(*args, **kwargs)
        finally:
            while len(_claims) > depth:
                _, f = _claims.pop()
                if f is not None:
                    f.close()

    dispatcher.compile = compile
    return dispatcher


class _KeyedCacheFile(IndexDataCacheFile):
    def _entry_name(self, key) -> str:
        return self._data_name_pattern.replace("{number:d}", hashlib.sha1(self._dump(key)).hexdigest()[:20])

    def load(self, key):
        data = super().load(key)
        if data is None:
            data = _claim(os.path.join(self._cache_path, self._entry_name(key) + ".lock"),
                          lambda: super(_KeyedCacheFile, self).load(key))
        if data is None:
            for callback in list(_compile_listeners):
                callback(self._index_name.removesuffix(".nbi"))
        return data

    def save(self, key, data):
        name = self._entry_name(key)
        with _index_lock(self._index_path):
            overloads = self._load_index()
            if not overloads and self._stale_index():  # its data files are dead (numba leaves them)
                for f in Path(self._cache_path).glob(self._data_name_pattern.replace("{number:d}", "*")):
                    f.unlink(missing_ok=True)
            if overloads.get(key) != name:
                overloads[key] = name
                self._save_index(overloads)
        self._save_data(name, data)
        _end_claim(os.path.join(self._cache_path, name + ".lock"))

    def _stale_index(self) -> bool:
        """Whether an index file exists that another numba version or other sources wrote."""
        try:
            with open(self._index_path, "rb") as f:
                if pickle.load(f) != self._version:
                    return True
                stamp, _ = pickle.loads(f.read())
        except FileNotFoundError:
            return False
        except Exception:  # unreadable: as good as stale
            return True
        return stamp != self._source_stamp


@functools.lru_cache(maxsize=None)
def _folder_stamp(folder: str) -> str:
    """A hash of the contents of every .py file in `folder`: the sources a kernel there may call."""
    h = hashlib.sha1()
    for f in sorted(Path(folder).glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _rehome(cache, py_func, user_wide_cls=UserWideCacheLocator, in_tree_cls=InTreeCacheLocator) -> None:
    """Give a numba Cache key-named data files, out of the source tree, stamped by its folder."""
    impl = cache._impl
    if isinstance(impl.locator, in_tree_cls):
        user_wide = user_wide_cls.from_function(py_func, impl.locator._py_file)
        if user_wide is not None:  # else (no writable user cache dir) numba's choice stays
            impl._locator = user_wide
            cache._cache_path = user_wide.get_cache_path()
    folder = str(Path(py_func.__code__.co_filename).resolve().parent)
    cache._cache_file = _KeyedCacheFile(cache_path=cache._cache_path, filename_base=impl.filename_base,
                                        source_stamp=_folder_stamp(folder))


def keyed_cache(dispatcher):
    """Switch a `cache=True` dispatcher to key-named data files, out of the source tree, invalidated
    by a change to any source file of its package folder; returns it."""
    _rehome(dispatcher._cache, dispatcher.py_func)
    return _claims_end_with(dispatcher)


def cache_usage() -> dict:
    """Where this package's compiled kernels (CPU and CUDA) are kept, and how much is there."""
    from coldkv.numba_kernels import attention  # a cached_njit kernel of this folder

    path = Path(attention.paged_attention_cpu._cache.cache_path)
    files = [f for f in path.glob("*") if f.is_file() and f.suffix != ".lock"] if path.is_dir() else []
    return {"path": str(path), "files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def cached_njit(**options):
    """`@cached_njit(fastmath=...)` == `@njit(cache=True, ...)` without the cross-process race; plain
    `njit` where no cache directory is writable (numba raises then)."""
    def wrap(f):
        try:
            return keyed_cache(njit(cache=True, **options)(f))
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return njit(**options)(f)
    return wrap


# ------------------------------------------------------------------------------ CUDA kernels
class _Unnamed(Exception):
    """A closure value the fingerprint cannot name the same way in every process."""


def _names(code) -> list[str]:
    """Global names a code object and the code nested in it may read."""
    out = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out += _names(c)
    return out


_LIBRARIES = {"numba", "numba_cuda", "numpy", "llvmlite", "math", "cmath", "operator", "functools", "builtins"}


def _fingerprint(obj, h, seen: set) -> None:
    """Feed h what obj contributes to a kernel's code (see the module docstring): values as such;
    our functions by name, bytecode, defaults, closure and the globals they read (numba's and
    numpy's by name: the versions are in the key); dispatchers and intrinsics by their Python
    function (and options)."""
    if isinstance(obj, (bool, int, float, str, bytes, type(None), np.generic, np.dtype)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    elif isinstance(obj, (tuple, list)):
        h.update(f"{type(obj).__name__}[".encode())
        for x in obj:
            _fingerprint(x, h, seen)
        h.update(b"]")
    elif isinstance(obj, dict):
        h.update(b"dict{")
        for k in sorted(obj, key=repr):
            _fingerprint(k, h, seen)
            _fingerprint(obj[k], h, seen)
        h.update(b"}")
    elif isinstance(obj, np.ndarray):
        h.update(f"array:{obj.dtype.str}{obj.shape};".encode() + hashlib.sha1(np.ascontiguousarray(obj)).digest())
    elif isinstance(obj, (type, types.ModuleType, types.BuiltinFunctionType)):
        h.update(f"{type(obj).__name__}:{getattr(obj, '__module__', '')}.{obj.__name__};".encode())
    elif isinstance(obj, types.FunctionType):
        # library code is named, not walked (its version is in the key); everything else is walked,
        # coldkv's and any copy of it (bench/variants): a copy named only would give a factory's
        # kernels one fingerprint (nvfp4 and iso3 requant, same signature, loaded each other's cubin)
        ours = obj.__globals__.get("__name__", "").split(".")[0] not in _LIBRARIES
        h.update(f"fn:{obj.__module__}.{obj.__qualname__};".encode())
        if not ours or id(obj) in seen:  # library code, or walked already
            return
        seen.add(id(obj))
        code = obj.__code__
        h.update(hashlib.sha1(code.co_code).digest())
        _fingerprint(obj.__defaults__, h, seen)
        for cell in obj.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell: a name the factory never bound
                raise _Unnamed(f"empty cell of {obj.__qualname__}") from None
            _fingerprint(value, h, seen)
        for name in _names(code):
            if name in obj.__globals__:
                h.update(f"global:{name}=".encode())
                _fingerprint(obj.__globals__[name], h, seen)
    elif hasattr(obj, "py_func") and hasattr(obj, "targetoptions"):  # a dispatcher (kernel / device function)
        h.update(f"dispatcher:{sorted(obj.targetoptions.items())!r};".encode())
        _fingerprint(obj.py_func, h, seen)
    elif isinstance(getattr(obj, "_defn", None), types.FunctionType):  # a numba @intrinsic
        h.update(f"intrinsic:{obj._name};".encode())
        _fingerprint(obj._defn, h, seen)
    elif type(obj).__module__.startswith("numba") and "0x" not in str(obj):  # numba types: uint32, Array(...)
        h.update(f"numba:{type(obj).__qualname__}:{obj};".encode())
    else:
        raise _Unnamed(f"{type(obj).__module__}.{type(obj).__qualname__}")


def kernel_fingerprint(dispatcher) -> str | None:
    """A hex digest of everything `dispatcher`'s machine code is built from (numba's own code aside:
    its version is in the cache key); None when some value it reads has no stable name."""
    h = hashlib.sha256()
    try:
        _fingerprint(dispatcher, h, set())
    except _Unnamed:
        return None
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _kernel_cache_class():
    """numba-cuda's CUDACache keyed by kernel_fingerprint (taken at the first compile, when every
    cell of a factory's closure is filled); a kernel without one is not cached. Loading or saving
    an entry never fails a run."""
    import numba_cuda
    from numba.cuda.dispatcher import CUDACache

    class KernelCache(CUDACache):
        def __init__(self, dispatcher):
            super().__init__(dispatcher.py_func)
            self._dispatcher, self._fp = dispatcher, ""  # "": not taken yet

        def _fingerprint(self) -> str | None:
            if self._fp == "":
                self._fp = kernel_fingerprint(self._dispatcher)
            return self._fp

        def _index_key(self, sig, codegen):
            key = (sig, codegen.magic_tuple(), numba_cuda.__version__, self._fingerprint())
            lc = getattr(self, "_launch_config_key", None)  # numba-cuda >= 0.30 only
            return key if lc is None else key + (("launch_config", lc),)

        def load_overload(self, sig, target_context):
            if self._fingerprint() is None:
                return None
            try:
                return super().load_overload(sig, target_context)
            except Exception:  # an unreadable entry (truncated, another version's pickle): compile
                return None

        def save_overload(self, sig, data):
            if self._fingerprint() is None:
                return
            try:
                super().save_overload(sig, data)
            except Exception:  # a full disk, a kernel numba cannot pickle: the run goes on uncached
                pass

    return KernelCache


def cuda_kernel(fn=None, **options):
    """`@cuda_kernel` / `@cuda_kernel(max_registers=128)`: `cuda.jit(**options)` for a kernel, whose
    compiled code is kept on disk (numba's cache directory) and loaded by the next process instead
    of compiled again. max_registers None or 0 means no cap. Under the CUDA simulator: plain
    `cuda.jit`, without max_registers (it has no register file)."""
    from numba import cuda

    if not options.get("max_registers", 1) or config.ENABLE_CUDASIM:
        options.pop("max_registers", None)

    def wrap(f):
        if config.ENABLE_CUDASIM:
            return cuda.jit(**options)(f)
        disp = cuda.jit(**options)(f)
        try:
            from numba.cuda.core import caching

            cache = _kernel_cache_class()(disp)
            _rehome(cache, f, caching._UserWideCacheLocator, caching._InTreeCacheLocator)
        except (RuntimeError, ImportError, AttributeError):  # no writable cache directory, or a
            return disp  # numba-cuda laid out otherwise: compiled in every process, as cuda.jit
        disp._cache = cache
        return _claims_end_with(disp)

    return wrap(fn) if fn is not None else wrap
