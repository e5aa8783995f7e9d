"""Compile prefill attention kernels for sm_90a offline and print what ptxas says (no GPU needed).

    python bench/ptxas_prefill.py --formats nvfp4 bf16 --kernels wg8a wg8w3 [--ptxas PATH] [--sass DIR]

Per (format, kernel): registers, spills and ptxas's wgmma warnings (C7511-C7518: "wgmma.mma_async
instructions are serialized due to ..."; docs/kernels_log.md "Prefill, session 16"), and with
nvdisasm on PATH the SASS counts of HGMMA / WARPGROUP.DEPBAR (a serialized kernel has one DEPBAR
per HGMMA). The kernel is the device-position build at head_dim 128, G 2, as the backend runs it.
Check every change to the wgmma kernels with it: ptxas serializes silently otherwise.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def offline_sm90() -> None:
    """Let numba compile for sm_90 without a GPU (kernels calling device functions ask the current
    device for its compute capability)."""
    import numba.cuda.dispatcher as dispatcher

    class _Sm90:
        compute_capability = (9, 0)

    dispatcher.get_current_device = lambda: _Sm90()


def tool_args(ap: argparse.ArgumentParser) -> None:
    """--ptxas and --sass, the options every offline report takes."""
    ap.add_argument("--ptxas", default=shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas")
    ap.add_argument("--sass", default="", help="keep the .ptx / .cubin / .sass files in this folder")


def prepare(args) -> Path:
    """Compile for sm_90 offline from here on; -> the folder for the files (--sass or a temporary one)."""
    offline_sm90()
    out = Path(args.sass or tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    return out


def assemble(py_func, sig: str, base: Path, ptxas: str, arch: str = "sm_90",
             maxrregcount: int = 0) -> tuple[list[str], str]:
    """PTX of py_func for sig -> base.ptx / .cubin (/ .sass with nvdisasm on PATH), at most
    maxrregcount registers (0: no cap); -> (ptxas's register / spill / warning lines, the SASS
    text or "")."""
    from numba import cuda

    ptx, _ = cuda.compile_ptx(py_func, sig, cc=(9, 0))
    # this ptxas reads PTX 8.7; wgmma needs the arch-specific target (numba writes plain sm_90)
    ptx = re.sub(r"\.version \d+\.\d+", ".version 8.7", ptx).replace(".target sm_90", f".target {arch}")
    base.with_suffix(".ptx").write_text(ptx)
    cap = [f"-maxrregcount={maxrregcount}"] if maxrregcount else []
    r = subprocess.run([ptxas, f"-arch={arch}", "-v", *cap, str(base.with_suffix(".ptx")), "-o",
                        str(base.with_suffix(".cubin"))], capture_output=True, text=True)
    info = [re.sub(r"'_Z\w+'", "", line).strip() for line in (r.stdout + r.stderr).splitlines()
            if re.search(r"registers|spill|serialized|rror", line)]
    nvdisasm = shutil.which("nvdisasm")
    sass = ""
    if nvdisasm and r.returncode == 0:
        sass = subprocess.run([nvdisasm, "-c", str(base.with_suffix(".cubin"))], capture_output=True, text=True).stdout
        base.with_suffix(".sass").write_text(sass)
    return info, sass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", nargs="+", default=["nvfp4", "bf16"], help="K = V format (bf16 int8 nvfp4 iso3), or K/V")
    ap.add_argument("--kernels", nargs="+", default=["wg8a", "wg8w3"], help="names of attention_cuda.PREFILL_KERNELS")
    tool_args(ap)
    args = ap.parse_args()
    out = prepare(args)
    from coldkv.numba_kernels import attention_prefill as AP
    from coldkv.numba_kernels.attention_cuda import PREFILL_KERNELS
    from coldkv.numba_kernels.quant import FORMAT_IDS

    for fmt in args.formats:
        kf, vf = (FORMAT_IDS[x] for x in (fmt.split("/") * 2)[:2])
        for name in args.kernels:
            kw = PREFILL_KERNELS[name]
            kern = AP.get_prefill_kernel(kf, vf, 2, 128, True, kind=kw["mma_prefill"], warps=kw["mma_warps"],
                                         pingpong=kw.get("mma_pingpong", False), pv_async=kw["mma_pv_async"],
                                         ws=kw["mma_ws"], depth=kw["mma_depth"])
            cap = kern.targetoptions.get("max_registers") or 0  # the kernel's own cap (ws: one block an SM)
            info, sass = assemble(kern.py_func, AP.prefill_sig(kf, vf, True),
                                  out / f"{fmt.replace('/', '-')}_{name}", args.ptxas, "sm_90a",
                                  cap)
            counts = f"  HGMMA {sass.count('HGMMA')}, WARPGROUP.DEPBAR {sass.count('WARPGROUP.DEPBAR')}" if sass else ""
            print(f"{fmt} {name}:{counts}")
            for line in info:
                print("   ", line)


if __name__ == "__main__":
    main()
