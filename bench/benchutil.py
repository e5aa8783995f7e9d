"""Shared by the benchmark drivers (run as `python bench/X.py`, so this imports as `benchutil`)."""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_commit(arg: str | None = None) -> str:
    """The commit to record: --commit if given (the device copy has no .git), else HEAD."""
    if arg:
        return arg
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions() -> dict:
    """The software a GPU benchmark ran on (torch required; transformers where installed)."""
    import importlib.metadata as md
    import platform

    import numpy as np
    import torch

    out = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
           "torch_cuda": torch.version.cuda}
    for name in ("numba", "numba-cuda", "transformers"):
        try:
            out[name.replace("-", "_")] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def lead_timed(launch, repeats: int) -> tuple[float, list[float], float]:
    """Median milliseconds of launch() between CUDA events over `repeats` runs (1 warm-up), the
    runs, and the median host milliseconds to enqueue one (must stay well under the first).
    Each timed run is enqueued behind an untimed one still running, so the start event fires when
    the GPU reaches it, not when the host gets round to it. With the events around a lone launch,
    the host's launch cost (Numba's argument handling, 0.06-0.13 ms) was timed as GPU time: one
    H200 read bf16 requant at 0.490 ms timed that way and 0.342 ms timed this way
    (docs/kernels_log.md "Session 25")."""
    import time

    import numpy as np
    from numba import cuda

    launch()
    cuda.synchronize()
    times, host = [], []
    for _ in range(repeats):
        start, end = cuda.event(timing=True), cuda.event(timing=True)
        launch()  # the lead run: busy on the GPU while the host enqueues the timed one
        t0 = time.perf_counter()
        start.record()
        launch()
        end.record()
        host.append((time.perf_counter() - t0) * 1e3)
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end))
    return float(np.median(times)), times, float(np.median(host))


def compile_in_workers(fn, jobs: list[tuple], workers: int) -> list[str]:
    """Run fn(*job) for every job in up to `workers` spawned processes; -> their errors, a line
    each. A process compiles one kernel at a time (~30 s for a wgmma prefill kernel: session 37's
    two prefill benches spent 183 and 128 s of a 430 s device call compiling one after another),
    and every process shares the disk cache of compiled kernels (numba_kernels/jit_cache), so a
    driver that first runs its compile cases here then loads them in its own loop. fn: a
    module-level function of the driver (spawned processes import it by name). workers <= 1 or
    a single job: nothing runs here."""
    if workers <= 1 or len(jobs) <= 1:
        return []
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(min(workers, len(jobs))) as pool:
        return [e for e in pool.starmap(_run_job, [(fn, job) for job in jobs]) if e]


def compile_cases(fn, jobs: list[tuple], workers: int) -> list[str]:
    """A kernel bench's compile step: fn(*job) for every job in `workers` processes
    (compile_in_workers), then in this one (loading what they compiled); -> the errors."""
    errors = compile_in_workers(fn, jobs, workers) + [_run_job(fn, job) for job in jobs]
    return [e for e in dict.fromkeys(errors) if e]  # a case failing in both places: once


def _run_job(fn, job: tuple) -> str:
    try:
        fn(*job)
        return ""
    except Exception as exc:  # reported by the caller, which compiles the case again itself
        return f"{fn.__name__}{job}: {exc!r}"


def prompt_ids(tok, n: int) -> list[int]:
    """n token ids: the examples' texts, tokenized and repeated to the length."""
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "examples").glob("*.txt")))
    ids = tok.encode(text)
    return (ids * (n // len(ids) + 1))[:n]


_SMI_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def parse_smi(lines, start=None, end=None) -> dict | None:
    """Summary of `nvidia-smi --query-gpu=<_SMI_FIELDS> --format=csv,noheader,nounits` lines (one
    GPU), of the samples stamped within [start, end] (datetimes; None: all): SM clock median / min
    (MHz), max power (W) and temperature (C), and the clock-event reasons seen (hex bitmasks other
    than 0: power or thermal capping, ...). None without samples."""
    from datetime import datetime

    rows = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        try:
            t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
            row = (float(parts[1]), float(parts[2]), float(parts[3]), parts[4])
            int(row[3], 16)
        except (IndexError, ValueError):
            continue
        if (start is None or t >= start) and (end is None or t <= end):
            rows.append(row)
    if not rows:
        return None
    mhz = sorted(r[0] for r in rows)
    return {"samples": len(rows), "sm_mhz_median": mhz[len(mhz) // 2], "sm_mhz_min": mhz[0],
            "power_w_max": max(r[1] for r in rows), "temp_c_max": max(r[2] for r in rows),
            "event_reasons": sorted({r[3] for r in rows if int(r[3], 16) != 0})}


def clocks_under_load(fn, seconds: float = 0.5, sync=None) -> dict | None:
    """Runs fn() back to back for `seconds` while nvidia-smi samples the GPU every 20 ms, and
    returns parse_smi's summary of the samples taken meanwhile: the SM clock a kernel actually ran
    at. A compute-bound kernel's ratio to a copy kernel moves with it (the requant kernels read
    0.56-0.81x of copy on three H200s in session 15 while the copy did not move). None where
    nvidia-smi is missing or sampled nothing; {"error": ...} if sampling failed (a timing is worth
    more than its clock: callers keep theirs either way)."""
    import time
    from datetime import datetime

    try:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits",
                                "-lms", "20"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None
    try:
        time.sleep(0.3)  # nvidia-smi's start
        start = datetime.now()
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            for _ in range(20):
                fn()
            if sync:
                sync()
        end = datetime.now()
        smi.terminate()
        out, _ = smi.communicate(timeout=10)
    except Exception as exc:
        smi.kill()
        return {"error": f"{type(exc).__name__}: {exc}"}
    return parse_smi(out.splitlines(), start, end)


@functools.lru_cache(maxsize=None)
def gemm_out16(m) -> bool:
    """Whether a numba_kernels/layers.py version reads the QKV and gate|up GEMM outputs as 16-bit
    bits (session 30 on; float32 before): its qkv_rope_append_kernel builder takes F16."""
    import inspect

    fn = getattr(m.qkv_rope_append_kernel, "__wrapped__", m.qkv_rope_append_kernel)
    return "F16" in inspect.signature(fn).parameters


def layers_today(m):
    """An older numba_kernels/layers.py behind today's launcher API, for A/Bs against it: before
    fp16 checkpoints (session 18) the launchers took no f16= and the attention output's rounding
    was launch_to_bf16. A module that has today's API is returned as it is."""
    import types

    if not hasattr(m, "launch_to_bf16"):
        return m
    shim = types.ModuleType(m.__name__)  # a module: hashable, as bench/layers.py's dicts need
    shim.__dict__.update({k: v for k, v in vars(m).items() if k != "__name__"})
    for name in ("launch_embed", "launch_rms_norm", "launch_swiglu"):
        setattr(shim, name, lambda *args, f16=False, fn=getattr(m, name): fn(*args))
    return shim
