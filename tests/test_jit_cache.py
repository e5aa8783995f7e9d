"""cached_njit: cached overloads of one function never share a data file, whatever the index says.

Replays the interleaving two processes can produce: both read the index before either wrote it,
each saves a different signature, and the first one's index write lands last. numba's own naming
(by index order) then loads the second signature's code for the first key; ours does not.
"""
import os

import numba
import numpy as np
import pytest
from numba.core.caching import IndexDataCacheFile

from coldkv.numba_kernels import attention, quant
from coldkv.numba_kernels.jit_cache import _KeyedCacheFile, cached_njit


def _race(cls, tmp_path):
    a = cls(cache_path=str(tmp_path), filename_base="f-1.py312", source_stamp=("stamp", 1))
    b = cls(cache_path=str(tmp_path), filename_base="f-1.py312", source_stamp=("stamp", 1))
    a.save("key-int8", b"code for int8")
    a_index = a._load_index()
    b._load_index = lambda: {}  # b read the index before a wrote it
    b.save("key-uint8", b"code for uint8")
    a._save_index(a_index)  # a's index write lands last
    return a.load("key-int8")


def test_numba_naming_mixes_signatures_in_this_race(tmp_path):
    assert _race(IndexDataCacheFile, tmp_path) == b"code for uint8"  # the bug this module exists for


def test_keyed_naming_keeps_each_signature(tmp_path):
    assert _race(_KeyedCacheFile, tmp_path) == b"code for int8"


def test_runtime_cpu_kernels_use_keyed_cache():
    for f in (attention.paged_attention_cpu, quant.append_cpu, quant.dequant_rows_cpu, quant.requant_c4g64_cpu):
        assert isinstance(f._cache._cache_file, _KeyedCacheFile), f


@pytest.mark.skipif(bool(numba.config.CACHE_DIR), reason="NUMBA_CACHE_DIR set: the user's directory is kept")
def test_cache_files_stay_out_of_the_package():
    """Never in the package's __pycache__: in a regular install that is site-packages, where pip
    uninstall leaves the files and the leftover coldkv/ directory shadows a later editable install."""
    package = os.path.dirname(os.path.abspath(quant.__file__))
    for f in (attention.paged_attention_cpu, quant.append_cpu, _total):
        path = os.path.abspath(f._cache._cache_file._cache_path)
        assert os.path.commonpath([path, package]) != package, path


@cached_njit()
def _total(x):
    return x.sum()


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_cached_njit_compiles_per_dtype(dtype):
    x = np.array([-1, 2, 3], np.int8).astype(dtype)
    assert _total(x) == x.astype(np.int64).sum()


def test_cache_follows_an_edit_of_a_called_function_in_another_file(tmp_path):
    """numba alone keeps a cached kernel after a function it calls changes in another file (its
    stamp is the kernel's own file): g(1) stayed 20 after f changed from x + 1 to x + 2. Our stamp
    covers the package folder, so the next process recompiles, and the one after that hits the cache."""
    import subprocess
    import sys

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from numba.extending import register_jitable\n\n\n@register_jitable\n"
                              "def f(x):\n    return x + 1\n")
    (pkg / "b.py").write_text("from coldkv.numba_kernels.jit_cache import cached_njit\nfrom pkg.a import f\n\n\n"
                              "@cached_njit()\ndef g(x):\n    return f(x) * 10\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}

    def run() -> list[str]:
        code = "from pkg.b import g; print(g(1), sum(g.stats.cache_hits.values()))"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                             cwd=tmp_path)
        return out.stdout.split()

    assert run() == ["20", "0"]
    assert run() == ["20", "1"]  # cached
    (pkg / "a.py").write_text((pkg / "a.py").read_text().replace("x + 1", "x + 2"))
    assert run() == ["30", "0"]  # recompiled: the callee's file changed
    assert run() == ["30", "1"]
