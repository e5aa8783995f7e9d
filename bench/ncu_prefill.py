"""The prefill launch of bench/attention_prefill.py ("fa" path, one chunk), run twice, for ncu:
    python3 bench/ncu_prefill.py bf16 nvfp4 [--T 2048 --context 32768 --shape 4/2/128]"""
import argparse
import sys

import torch

sys.path.insert(0, "bench")
import attention_prefill as AP  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("formats", nargs="+")
ap.add_argument("--T", type=int, default=2048)
ap.add_argument("--context", type=int, default=32768)
ap.add_argument("--shape", default="4/2/128")
ap.add_argument("--path", default="fa")
a = ap.parse_args()
Hq, H, D = (int(x) for x in a.shape.split("/"))
for fmt in a.formats:
    c = AP.PrefillCase(torch, fmt, a.context, Hq, H, D, a.T)
    c.run(AP.PATHS[a.path])
    c.run(AP.PATHS[a.path])
    torch.cuda.synchronize()
    print(fmt, "ran")
