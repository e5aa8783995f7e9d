"""Prefill attention: one 512-token chunk over the paged cache vs torch SDPA on bf16 K/V (H200 + torch).

    python bench/attention_prefill.py --commit HASH --out $OUT/attention_prefill.json [--wait-pid PID]

One chunk of T = 512 query tokens at cache positions pos0 = L - T (L ~ 4k, 32k, 128k keys), shapes
(q heads / kv heads / head_dim) 4/2/128 (the bundled model) and 32/8/128, bf16 and nvfp4 K/V. The
pools are filled on the device with random codes and scales (shuffled block table, as
bench/attention_decode.py does), then per row:
  1. validate: coldkv's output on 8 query rows (first, last, spread) vs a float64 torch attention
     over the same pages dequantized by attention_decode.torch_dequant (written from the format
     definitions), with the causal chunk mask (row t sees keys 0..pos0 + t); bound as in the decode
     bench: 1e-4 x max|ref| plus the 16-bit rounding of q and p;
  2. time, CUDA events, 1 GiB L2 flush before each call, median of --repeats:
       `tok`  the previous path: the decode kernel with one query token per warp split
              (kernel="mma", mma_prefill=False), every token re-reads and re-decodes its K/V;
       `fa` / `fa8` the prefill kernel with MMA rows = (query token, q head) and K/V tiles
              shared by the block's 4 / 8 warps (mma_prefill="fa", mma.sync);
       `wg` / `wg8` / `wg8a` / `wg8w3` ... the same on warpgroup MMAs (mma_prefill="wg", sm_90a;
              every name of attention_cuda.PREFILL_KERNELS; wg8a: O += P V runs on under the
              next tile's decode; wg8w*: a producer warpgroup loads the tiles); kernel="auto"
              picks by the formats (attention_cuda._prefill_auto);
       SDPA   torch scaled_dot_product_attention on bf16 q/K/V [1, heads, T | L, D] with the same
              causal chunk mask (lower-right aligned: causal_lower_right, enable_gqa), which is
              checked against an explicit boolean mask once at start-up.

Napkin math (docs/kernels_log.md, "FlashAttention-2-style variant"): attention FLOPs of the chunk = 4 T L_avg Hq D (QK^T and PV, 2 per
multiply-add), L_avg = pos0 + (T + 1) / 2; SDPA runs them on bf16 tensor cores. The `tok` path
decodes every key once per query token and kv head, the prefill kernels once per query block.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchutil import versions  # noqa: E402
from attention_decode import P, event_time, make_plane, torch_dequant  # noqa: E402
from benchutil import compile_cases, git_commit  # noqa: E402

from coldkv.numba_kernels import attention_cuda as A  # noqa: E402
from coldkv.numba_kernels import quant as Q  # noqa: E402

FORMATS = {"bf16": (Q.BF16, Q.BF16), "int8": (Q.INT8, Q.INT8), "nvfp4": (Q.NVFP4, Q.NVFP4), "iso3": (Q.ISO3, Q.ISO3),
           # K / V of other formats, as a --kv-table JSON may give a layer (auto: wg8a on sm_90)
           "int8/nvfp4": (Q.INT8, Q.NVFP4), "bf16/nvfp4": (Q.BF16, Q.NVFP4), "int8/iso3": (Q.INT8, Q.ISO3)}
PATHS = {"tok": {"kernel": "mma", "mma_prefill": False},
         # FA2-style kernel (attention_prefill._build_prefill_fa), the auto default since 6390c47
         "fa": {"kernel": "mma", "mma_prefill": "fa"},
         "fa8": {"kernel": "mma", "mma_prefill": "fa", "mma_warps": 8},
         "fa@r168": {"kernel": "mma", "mma_prefill": "fa", "max_registers": 168},
         "fa8@r128": {"kernel": "mma", "mma_prefill": "fa", "mma_warps": 8, "max_registers": 128},
         # the same on Hopper warpgroup MMAs (sm_90a): one or two warpgroups a block
         # (the backend's names: every knob given, as one left out takes auto's value)
         **{k: {"kernel": "mma", **kw} for k, kw in A.PREFILL_KERNELS.items() if k != "fa"}}
SHAPES = [(4, 2, 128), (32, 8, 128)]
CONTEXTS = [4096, 32768, 131072]
T_CHUNK = 512


class PrefillCase:
    def __init__(self, torch, fmt, L, Hq, H, D, T, seed=0):
        self.torch, self.L, self.Hq, self.H, self.D, self.T = torch, L, Hq, H, D, T
        self.kf, self.vf = FORMATS[fmt]
        self.pos0 = L - T
        gen = torch.Generator(device="cuda").manual_seed(seed)
        npl = -(-L // P)
        self.npl = npl
        n_pages = H * npl + 1
        table = torch.full((2, H, npl + 1), -1, dtype=torch.int32, device="cuda")
        for plane in range(2):
            table[plane, :, :npl] = torch.randperm(n_pages, device="cuda", generator=gen)[: H * npl].reshape(H, npl).int()
        self.table_t = table
        self.pools_t = [make_plane(torch, self.kf, n_pages, D, gen), make_plane(torch, self.vf, n_pages, D, gen)]
        self.gscale_t = torch.ones((2, H), device="cuda")
        self.q_t = torch.randn((T, Hq, D), device="cuda", generator=gen)
        self.out_t = torch.full((T, Hq, D), float("nan"), device="cuda")
        ca = cuda.as_cuda_array
        self.args = [ca(self.q_t), ca(self.out_t), self.pos0, 1.0 / math.sqrt(D),
                     self.kf, ca(self.pools_t[0][0]), ca(self.pools_t[0][1]),
                     self.vf, ca(self.pools_t[1][0]), ca(self.pools_t[1][1]), ca(self.gscale_t), ca(table)]
        # the backend's prefill workspace: 16 splits of a 512-token chunk
        self.ws = A.AttentionWorkspace(16, T, Hq, D)

    def run(self, kw):
        A.paged_attention_cuda(*self.args, self.ws, **kw)

    def reference(self, rows):
        """float64 outputs of query rows `rows` [R, Hq, D] and the bound on the 16-bit q/p rounding."""
        torch = self.torch
        dense = []
        for plane, fmt in enumerate((self.kf, self.vf)):
            codes, scales = self.pools_t[plane]
            x = torch.empty((self.H, self.L, self.D), device="cuda", dtype=torch.float64)
            for h in range(self.H):
                pages = self.table_t[plane, h, : self.npl].long()
                x[h] = torch_dequant(torch, fmt, codes[pages], scales[pages], 1.0, self.D).reshape(-1, self.D)[: self.L].double()
            dense.append(x)
        k, v = dense
        G, R = self.Hq // self.H, len(rows)
        qs = float(np.float32(1.0 / math.sqrt(self.D) * A._LOG2E))
        q = self.q_t[rows]  # [R, Hq, D]
        q = (q * qs).to(torch.bfloat16 if self.kf == Q.BF16 else torch.float16).double() / qs
        eps = 2.0 ** -8 if self.vf == Q.BF16 else 2.0 ** -11
        q = q.reshape(R, self.H, G, self.D)
        s = torch.einsum("rhgd,hld->rhgl", q, k) / math.sqrt(self.D)
        lim = torch.tensor([self.pos0 + t for t in rows], device="cuda")
        mask = torch.arange(self.L, device="cuda")[None, :] > lim[:, None]  # [R, L]
        s.masked_fill_(mask[:, None, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1)
        out = torch.einsum("rhgl,hld->rhgd", p, v).reshape(R, self.Hq, self.D)
        extra = 2 * eps * torch.einsum("rhgl,hld->rhgd", p, v.abs()).reshape(R, self.Hq, self.D)
        return out, extra

    def kv_bytes(self):
        per_tok = sum((c.element_size() * c[0, 0].numel() + s.element_size() * s[0, 0].numel())
                      for c, s in self.pools_t)
        return per_tok * self.L * self.H


def sdpa_fn(torch, Hq, H, L, D, T, explicit=False):
    """SDPA on bf16 of the shape with the causal chunk mask; returns (fn, tensors, mode)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn((1, Hq, T, D), device="cuda", dtype=torch.bfloat16)
    k = torch.randn((1, H, L, D), device="cuda", dtype=torch.bfloat16)
    v = torch.randn((1, H, L, D), device="cuda", dtype=torch.bfloat16)
    if not explicit:
        try:
            from torch.nn.attention.bias import causal_lower_right

            bias = causal_lower_right(T, L)
            fn = lambda: sdpa(q, k, v, attn_mask=bias, enable_gqa=True)  # noqa: E731
            fn()
            return fn, (q, k, v), "causal_lower_right"
        except Exception as exc:  # older torch or no GQA with a CausalBias
            print(f"causal_lower_right unavailable: {exc!r}", flush=True)
    mask = torch.arange(L, device="cuda")[None, :] <= (L - T + torch.arange(T, device="cuda"))[:, None]
    fn = lambda: sdpa(q, k, v, attn_mask=mask, enable_gqa=True)  # noqa: E731
    return fn, (q, k, v), "bool_mask"


def check_sdpa_mask(torch):
    """The lower-right causal bias == an explicit boolean mask (small shape, float32)."""
    fn, (q, k, v), mode = sdpa_fn(torch, 4, 2, 1000, 64, 64)
    if mode != "causal_lower_right":
        return mode, True
    ref_fn, _, _ = sdpa_fn(torch, 4, 2, 1000, 64, 64, explicit=True)
    mask = torch.arange(1000, device="cuda")[None, :] <= (1000 - 64 + torch.arange(64, device="cuda"))[:, None]
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return mode, bool((fn() - ref).abs().max() < 2e-2)


def compile_case(fmt: str, path: str, Hq: int, H: int, D: int, T: int) -> None:
    """Compile the kernel of one (format, path, shape): a small case run once (the kernels take
    T and L at run time, so a short cache compiles the same code)."""
    import torch

    PrefillCase(torch, fmt, max(1024, T), Hq, H, D, T).run(PATHS[path])
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="*", default=CONTEXTS)
    ap.add_argument("--formats", nargs="*", default=["bf16", "nvfp4"], choices=list(FORMATS),
                    help="K and V format (one name), or K/V")
    ap.add_argument("--shapes", nargs="*", default=None, help="Hq/H/D, e.g. 4/2/128")
    ap.add_argument("--paths", nargs="*", default=["fa", "wg8"])
    ap.add_argument("--T", type=int, default=T_CHUNK)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "attention_prefill.json"))
    ap.add_argument("--commit", default=None)
    ap.add_argument("--wait-pid", type=int, default=0, help="compile, then wait for this process before timing")
    ap.add_argument("--jobs", type=int, default=1, help="compile the kernels in this many processes first "
                    "(benchutil.compile_in_workers)")
    args = ap.parse_args()
    import torch

    shapes = [tuple(int(x) for x in s.split("/")) for s in args.shapes] if args.shapes else SHAPES
    doc = {"device": torch.cuda.get_device_name(), "commit": git_commit(args.commit),
           "command": " ".join([sys.executable] + sys.argv), "versions": versions(), "page_tokens": P,
           "chunk_tokens": args.T, "repeats": args.repeats, "paths": PATHS, "results": [], "errors": []}

    def save():
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))

    t0 = time.perf_counter()  # compile every kernel (may overlap the gpu tests), then time
    jobs = [(fmt, path, Hq, H, D, args.T) for Hq, H, D in shapes for fmt in args.formats for path in args.paths]
    doc["errors"] += compile_cases(compile_case, jobs, args.jobs)
    doc["compile_s"] = time.perf_counter() - t0
    print(f"compiled in {doc['compile_s']:.1f}s", flush=True)
    if args.wait_pid:
        while os.path.exists(f"/proc/{args.wait_pid}"):
            time.sleep(0.5)
    try:
        doc["sdpa_mask_mode"], doc["sdpa_mask_ok"] = check_sdpa_mask(torch)
    except Exception as exc:
        doc["errors"].append(f"sdpa mask check: {exc!r}")
    flush = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    save()
    T = args.T
    for Hq, H, D in shapes:
        for L in args.contexts:
            L_avg = (L - T) + (T + 1) / 2
            flops = 4.0 * T * L_avg * Hq * D
            try:
                fn, tens, mode = sdpa_fn(torch, Hq, H, L, D, T)
                t_sdpa, _ = event_time(torch, fn, flush, args.repeats)
                del fn, tens
            except Exception as exc:
                doc["errors"].append(f"sdpa {Hq}/{H}/{D} L={L}: {exc!r}")
                t_sdpa, mode = float("nan"), None
            for fmt in args.formats:
                rec = {"format": fmt, "context": L, "pos0": L - T, "T": T, "q_heads": Hq, "kv_heads": H,
                       "head_dim": D, "flops": flops, "sdpa_bf16_us": t_sdpa, "sdpa_mode": mode,
                       "sdpa_TFLOPs": flops / t_sdpa / 1e6}
                try:
                    c = PrefillCase(torch, fmt, L, Hq, H, D, T, seed=L + Hq)
                    rows = sorted({0, 1, 7, 8, 100, T // 2 + 3, T - 2, T - 1})
                    ref, extra = c.reference(rows)
                    rec["kv_bytes"] = c.kv_bytes()
                    rec["splits_rows"] = A.plan_prefill(T, H, Hq // H, L, P, c.ws.n_sm, 16)
                    for path in args.paths:
                        c.out_t.fill_(float("nan"))
                        c.run(PATHS[path])
                        torch.cuda.synchronize()
                        got = c.out_t[rows].double()
                        tol = 1e-4 * max(float(ref.abs().max()), 1.0) + extra
                        rec[f"{path}_max_abs_err"] = float((got - ref).abs().max())
                        rec[f"{path}_valid"] = bool(torch.isfinite(c.out_t).all()) and bool(((got - ref).abs() <= tol).all())
                        t, cpu = event_time(torch, lambda: c.run(PATHS[path]), flush, args.repeats)
                        rec.update({f"{path}_us": t, f"{path}_enqueue_us": cpu, f"{path}_TFLOPs": flops / t / 1e6,
                                    f"{path}_vs_sdpa": t_sdpa / t})
                        print(f"{fmt} {Hq}/{H}/{D} L={L} {path}: {t:.0f} us valid={rec[f'{path}_valid']}", flush=True)
                    for path in args.paths:
                        if path != "tok" and f"{path}_us" in rec and "tok_us" in rec:
                            rec[f"{path}_speedup_vs_tok"] = rec["tok_us"] / rec[f"{path}_us"]
                    del c, ref, extra
                except Exception as exc:
                    rec["error"] = repr(exc)
                    doc["errors"].append(f"{fmt} {Hq}/{H}/{D} L={L}: {traceback.format_exc(limit=3)}")
                doc["results"].append(rec)
                print(json.dumps(rec), flush=True)
                save()
                torch.cuda.empty_cache()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
