"""ms per decode step of the bundled model (bench/generate.py's launch_overhead: eager, graph,
pipelined graph; 512 prompt tokens, bf16 KV) for this tree's coldkv and for other copies of the
package, each in its own process, on one GPU, the order reversed every other round:

    git archive C coldkv | tar x -C bench/variants/C --exclude=coldkv/models
    python bench/decode_step_ab.py --commit HEAD_C --variants bench/variants/C --rounds 2 --out F.json

A copy without its models/ runs this tree's bundled model.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys
sys.path.insert(0, {pkg!r})
import coldkv  # this copy, before generate.py puts the repository first on sys.path
sys.path.insert(0, {bench!r})
from generate import launch_overhead
from pathlib import Path
r = launch_overhead(Path({model!r}), {new})
r["coldkv"] = coldkv.__file__
print("RESULT " + json.dumps(r))
"""


def run(pkg: Path, new: int) -> dict:
    code = CHILD.format(pkg=str(pkg), bench=str(ROOT / "bench"), model=str(ROOT / "coldkv" / "models" / "coldkv-tiny"),
                        new=new)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not lines:
        return {"error": (p.stderr or p.stdout)[-2000:]}
    return json.loads(lines[-1][len("RESULT "):])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="*", type=Path, default=[], help="copies of the package's parent directory")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from benchutil import git_commit, versions

    import torch

    doc = {"command": "python " + " ".join(sys.argv), "device": torch.cuda.get_device_name(0),
           "commit": git_commit(a.commit), "versions": versions(), "results": []}
    trees = [ROOT, *a.variants]
    for rnd in range(a.rounds):
        for pkg in trees if rnd % 2 == 0 else trees[::-1]:  # alternate who runs first: no order bias
            r = {"tree": "this" if pkg == ROOT else str(pkg), "round": rnd, **run(pkg.resolve(), a.new)}
            print(json.dumps(r), flush=True)
            doc["results"].append(r)
            a.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
