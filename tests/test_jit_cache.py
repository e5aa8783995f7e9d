"""cached_njit: cached overloads of one function never share a data file, whatever the index says.

Replays the interleaving two processes can produce: both read the index before either wrote it,
each saves a different signature, and the first one's index write lands last. numba's own naming
(by index order) then loads the second signature's code for the first key; ours does not.
"""
import os
from pathlib import Path

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


def test_concurrent_saves_keep_every_entry(tmp_path):
    """Two savers of one index at once (a benchmark's compile workers): the second reads the index
    while the first, having read it, has yet to write; with the index lock it waits, so both
    entries stay (unlocked, the later write drops the earlier one's key: a compile in the next
    process)."""
    import threading
    import time

    a, b, c = (_KeyedCacheFile(cache_path=str(tmp_path), filename_base="f-1.py312", source_stamp=("stamp", 1))
               for _ in range(3))
    a_read = threading.Event()
    load = a._load_index

    def slow_load():
        index = load()
        a_read.set()
        time.sleep(0.3)  # b reads (or waits for the lock) meanwhile
        return index

    a._load_index = slow_load
    t = threading.Thread(target=a.save, args=("key-a", b"code a"))
    t.start()
    assert a_read.wait(10)
    b.save("key-b", b"code b")
    t.join()
    assert set(c._load_index()) == {"key-a", "key-b"}
    assert (c.load("key-a"), c.load("key-b")) == (b"code a", b"code b")


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
    covers the package folder, so the next process recompiles, and the one after that hits the cache.
    The stamp is content, not mtimes: touching the files keeps the cache."""
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
    for f in pkg.glob("*.py"):  # a reinstall or a copy of the same sources: new mtimes, same content
        os.utime(f, (f.stat().st_atime + 100, f.stat().st_mtime + 100))
    assert run() == ["20", "1"]
    (pkg / "a.py").write_text((pkg / "a.py").read_text().replace("x + 1", "x + 2"))
    assert run() == ["30", "0"]  # recompiled: the callee's file changed
    assert run() == ["30", "1"]
    (pkg / "b.py").write_text((pkg / "b.py").read_text().replace("f(x) * 10", "(f(x) - 1) * 10"))
    assert run() == ["20", "0"]  # its own code changed: a new key, a new data file
    assert len(list((tmp_path / "cache").rglob("*.nbc"))) == 1  # the old one is deleted


_CLAIMER = """
import sys, time
from pkg.b import g
compile_ = g._compiler.compile

def slow_compile(*args, **kwargs):  # this process's compile: long enough for the other to start
    print("compiling", flush=True)
    time.sleep(2)
    if FAIL:
        raise RuntimeError("this compile fails")
    return compile_(*args, **kwargs)

g._compiler.compile = slow_compile
try:
    print(g(1), sum(g.stats.cache_hits.values()), flush=True)
except RuntimeError:
    print("failed", flush=True)
    time.sleep(60)  # alive, as a test that expects the error would be
"""


def _while_compiling(first: list[str], second: list[str], env: dict, cwd) -> tuple[str, str]:
    """Start `first` (a process that prints "compiling" once it has missed the cache), run `second`
    once it has; -> the stdout of both (the second's must end within 50 s: not held until the
    first exits)."""
    import subprocess

    proc = subprocess.Popen(first, env=env, cwd=cwd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "compiling"  # it has claimed the entry
        out = subprocess.run(second, env=env, cwd=cwd, capture_output=True, text=True, timeout=50)
        assert out.returncode == 0, out.stderr
        return proc.stdout.readline(), out.stdout
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("fail", [False, True])
def test_a_process_waits_for_anothers_compile_of_the_same_entry(tmp_path, fail):
    """Two processes miss one entry at once (pytest -n on a fresh machine): the second waits for the
    first's compile and loads what it saved instead of compiling too. A compile that raises ends the
    claim though its process lives on (60 s here), and the waiter compiles itself."""
    import sys

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "b.py").write_text("from coldkv.numba_kernels.jit_cache import cached_njit\n\n\n"
                              "@cached_njit()\ndef g(x):\n    return x * 20\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}
    code = "from pkg.b import g; print(g(1), sum(g.stats.cache_hits.values()))"
    first, second = _while_compiling([sys.executable, "-c", f"FAIL = {fail}" + _CLAIMER],
                                     [sys.executable, "-c", code], env, tmp_path)
    assert first.split() == (["failed"] if fail else ["20", "0"])
    assert second.split() == (["20", "0"] if fail else ["20", "1"])  # compiled itself / loaded


# ------------------------------------------------------------------------------ CUDA kernels
def _offline_cmd(code: str, cache_dir, seed: int = 1) -> tuple[list[str], dict]:
    """The command and environment of a process that runs code compiling CUDA kernels offline
    (tests/offline_cuda.py) with NUMBA_CACHE_DIR=cache_dir and PYTHONHASHSEED=seed."""
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(NUMBA_CACHE_DIR=str(cache_dir), PYTHONHASHSEED=str(seed),
               PYTHONPATH=os.pathsep.join([os.path.join(root, "tests"), root]))
    return [sys.executable, "-c", "import offline_cuda\n" + code], env


def _offline(code: str, cache_dir, seed: int) -> str:
    """Run _offline_cmd's process; -> its stdout."""
    import subprocess

    cmd, env = _offline_cmd(code, cache_dir, seed)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


_FINGERPRINTS = """
import importlib
from coldkv.numba_kernels import KERNEL_MODULES
from coldkv.numba_kernels.jit_cache import kernel_fingerprint
for m in KERNEL_MODULES:
    mod = importlib.import_module("coldkv.numba_kernels." + m)
    for fn, sig in mod.PTX_SIGNATURES + getattr(mod, "PTX_SIGNATURES_MORE", []):
        if not fn.targetoptions.get("device"):
            print(m, fn.py_func.__qualname__, id(fn), kernel_fingerprint(fn))
"""


def test_every_kernel_has_a_fingerprint_stable_across_processes(tmp_path):
    """numba-cuda's own closure hash (a pickle of the captured device functions) differed between
    two processes for every factory-built kernel, so each run compiled again and wrote one more
    file. The fingerprint must be the same in processes with different hash seeds, exist for every
    kernel the package builds (None would leave it uncached), and differ between different kernels."""
    runs = [[line.split() for line in _offline(_FINGERPRINTS, tmp_path, seed).splitlines()] for seed in (1, 2)]
    assert len(runs[0]) > 50 and all(row[3] != "None" for row in runs[0])
    assert [(m, q, fp) for m, q, _, fp in runs[0]] == [(m, q, fp) for m, q, _, fp in runs[1]]
    kernels = {(m, q, i): fp for m, q, i, fp in runs[0]}  # a kernel may be listed with several signatures
    assert len(set(kernels.values())) == len(kernels)


_COPY = """
import importlib.util
from coldkv.numba_kernels import requant
from coldkv.numba_kernels.jit_cache import kernel_fingerprint
spec = importlib.util.spec_from_file_location("variants.requant_copy", PATH)
copy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(copy)
for mod in (requant, copy):
    print(" ".join(kernel_fingerprint(fn) for fn, sig in mod.PTX_SIGNATURES))
"""


def test_a_copy_outside_the_package_fingerprints_each_kernel(tmp_path):
    """bench/variants holds copies of kernel files under other module names. Their functions were
    once fingerprinted by name only, so a factory's kernels shared one fingerprint and the copy's
    iso3 requant loaded its nvfp4 cubin (same signature; an H100 run at d023b36 failed validation).
    A copy must fingerprint every kernel apart, as the package does."""
    src = tmp_path / "requant_copy.py"
    src.write_text((Path(__file__).parents[1] / "coldkv/numba_kernels/requant.py").read_text())
    own, copy = (line.split() for line in _offline(f"PATH = {str(src)!r}" + _COPY, tmp_path, 1).splitlines())
    assert len(set(own)) == len(own) == 5
    assert len(set(copy)) == len(copy) == 5


_COMPILE = """
import hashlib
from coldkv.numba_kernels import layers as L
from coldkv.numba_kernels.jit_cache import cuda_kernel
sig = "void(float32[:,::1], uint16[:,::1])"
capped = cuda_kernel(max_registers=32)(L.swiglu_kernel(False).py_func)
for k in (L.swiglu_kernel(False), L.swiglu_kernel(True), capped):
    cubin = k.compile(sig)._codelibrary.get_cubin()
    print(sum(k._cache_hits.values()), hashlib.sha1(bytes(cubin.code)).hexdigest())
"""


def test_cuda_kernels_load_from_the_disk_cache_in_the_next_process(tmp_path):
    """Compiled offline for sm_90: the first process compiles and saves, a second one (another hash
    seed) loads each kernel's cubin instead of compiling, and gets the same bytes; a factory's two
    variants (bf16 / fp16) and the same kernel at another max_registers are separate entries."""
    first = [line.split() for line in _offline(_COMPILE, tmp_path, 1).splitlines()]
    second = [line.split() for line in _offline(_COMPILE, tmp_path, 2).splitlines()]
    assert [hits for hits, _ in first] == ["0", "0", "0"]
    assert [hits for hits, _ in second] == ["1", "1", "1"]
    assert [cubin for _, cubin in second] == [cubin for _, cubin in first]
    assert len({cubin for _, cubin in first}) == 3
    data = [f for f in tmp_path.rglob("*.nbc")]
    assert len(data) == 3, data  # no new file per run


_CUDA_CLAIMER = """
import time
import numba.cuda.dispatcher as dispatcher
bind = dispatcher._Kernel.bind

def slow_bind(self):  # this process's compile (offline_cuda's bind links the cubin)
    print("compiling", flush=True)
    time.sleep(2)
    return bind(self)

dispatcher._Kernel.bind = slow_bind
"""
_SWIGLU_HITS = """
from coldkv.numba_kernels import layers as L
k = L.swiglu_kernel(False)
k.compile("void(float32[:,::1], uint16[:,::1])")
print(sum(k._cache_hits.values()), flush=True)
"""


def test_a_process_waits_for_anothers_compile_of_a_cuda_kernel(tmp_path):
    """The same through numba-cuda's dispatch (offline, sm_90): the second process loads the cubin the
    first one compiled."""
    (first, env), (second, _) = (_offline_cmd(code, tmp_path) for code in (_CUDA_CLAIMER + _SWIGLU_HITS, _SWIGLU_HITS))
    first, second = _while_compiling(first, second, env, tmp_path)
    assert (first.strip(), second.strip()) == ("0", "1")


def test_simulator_kernels_are_not_cached():
    from numba import config

    from coldkv.numba_kernels import layers as L

    if not config.ENABLE_CUDASIM:
        pytest.skip("a GPU: kernels are cached")
    assert not hasattr(L.swiglu_kernel(False), "_cache")


_SWIGLU = """
import hashlib
import numpy as np
from numba import cuda
from coldkv.numba_kernels import layers as L
gu = cuda.to_device(L.ref_encode16(np.random.default_rng(0).standard_normal((64, 512))))
out = cuda.device_array((64, 256), np.uint16)
L.launch_swiglu(gu, out, 0)
k = L.swiglu_kernel(False)
print(sum(k._cache_hits.values()), sum(k._cache_misses.values()), hashlib.sha1(out.copy_to_host()).hexdigest())
"""


@pytest.mark.gpu
def test_gpu_kernel_from_the_disk_cache_runs_as_compiled(tmp_path):
    """On a GPU: the second process loads the kernel (a cache hit, no compile) and its output is
    the compiled kernel's, bit for bit."""
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", _SWIGLU], env=env, capture_output=True, text=True, check=True,
                           timeout=600).stdout.split() for _ in range(2)]
    assert runs[0][:2] == ["0", "1"] and runs[1][:2] == ["1", "0"]
    assert runs[1][2] == runs[0][2]


@pytest.mark.gpu
def test_gpu_generate_starts_faster_from_the_kernel_cache(tmp_path):
    """`coldkv generate --device cuda` twice on the bundled model with an empty cache directory:
    the second process loads its kernels instead of compiling them. Same tokens; the wall times
    go to stdout (pytest -s) for the log."""
    import subprocess
    import sys
    import time

    from coldkv.runtime.loader import resolve_model

    prompt = tmp_path / "p.txt"
    prompt.write_text("The capital of France is")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "coldkv", "generate", str(prompt), "--device", "cuda", "-n", "8", "--json",
           "--model", str(resolve_model(None))]
    outs, secs = [], []
    for _ in range(2):
        t = time.perf_counter()
        outs.append(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=600).stdout)
        secs.append(time.perf_counter() - t)
    print(f"coldkv generate --device cuda, wall s: empty kernel cache {secs[0]:.1f}, warm {secs[1]:.1f}")
    import json

    assert json.loads(outs[1])["tokens"] == json.loads(outs[0])["tokens"]
    assert secs[1] < secs[0]
