#!/usr/bin/env python3
"""Train the bundled model (coldkv-tiny): a small Qwen3 with HF transformers + torch.

A development tool (torch/transformers are not coldkv dependencies). Time-boxed by wall clock:

    PYTHONUNBUFFERED=1 python tools/train_model.py --data data/tok --out runs/tiny --minutes 6.5

Reads data/tok/{train,heldout}.npy and tokenizer.json (tools/train_tokenizer.py), writes an HF
checkpoint (bf16 safetensors, shards <= --shard, config.json, generation_config.json,
tokenizer.json, tokenizer_config.json) and train_log.json (steps, losses, held-out loss, bits
per byte, throughput) into --out.

Recipe: AdamW (betas .9/.95, wd .1 on matrices), linear warmup then constant then linear warmdown
to 0 over the last 35% of the *time* budget; bf16 autocast; three phases of sequence length at a
constant number of tokens per step (1k -> 4k -> 16k -> 32k); needle/passkey documents mixed in
(tools/needle_data.py) with extra loss weight on the answer tokens; PoSE position-id skipping so
the long phases see positions up to --pose-max.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from needle_data import NeedleMaker  # noqa: E402

# transformers treats any jump in position_ids (with no attention mask and no cache) as the start
# of a new packed sequence and blocks attention across it, which silently breaks PoSE; turn that off.
import transformers.masking_utils as _mu  # noqa: E402
if hasattr(_mu, "find_packed_sequence_indices"):
    _mu.find_packed_sequence_indices = lambda position_ids: None
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def make_config(args, vocab: int, eos: int) -> Qwen3Config:
    cfg = Qwen3Config(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=128, max_position_embeddings=args.pose_max,
        rope_theta=args.rope_theta, tie_word_embeddings=True, rms_norm_eps=1e-6,
        max_window_layers=args.layers, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
        initializer_range=0.02,
    )
    if getattr(cfg, "rope_parameters", None) is not None:
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": float(args.rope_theta)}
    return cfg


def check_pose_attention(model, device) -> None:
    """PoSE guard: with skipped position ids, tokens after the skip must still attend before it."""
    model.eval()
    with torch.no_grad():
        ids = torch.randint(5, 100, (1, 64), device=device)
        pos = torch.cat([torch.arange(32), torch.arange(32) + 1000]).unsqueeze(0).to(device)
        a = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0, -1].float()
        ids2 = ids.clone()
        ids2[0, :8] = ids2[0, :8] + 1
        b = model(input_ids=ids2, position_ids=pos, use_cache=False).logits[0, -1].float()
    model.train()
    assert (a - b).abs().max().item() > 1e-4, "PoSE positions block attention across the skip"


class Batches:
    """Batches of (input ids, labels weight, position ids) for one phase."""

    def __init__(self, train: np.ndarray, maker: NeedleMaker, rng: np.random.Generator, device):
        self.train = torch.from_numpy(train.astype(np.int64)).to(device)
        self.maker, self.rng, self.device = maker, rng, device

    def get(self, bsz: int, seq: int, p_needle: float, p_pose: float, pose_max: int, answer_w: float):
        n = self.train.numel()
        starts = torch.from_numpy(self.rng.integers(0, n - seq - 2, bsz)).to(self.device)
        x = self.train[starts[:, None] + torch.arange(seq + 1, device=self.device)]  # [B, S+1]
        w = torch.ones(bsz, seq, device=self.device)
        for b in range(bsz):
            if self.rng.random() < p_needle:
                task = "passkey" if self.rng.random() < 0.3 else "niah"
                k = 1 if task == "passkey" else int(self.rng.integers(1, 5))
                ids, am, _, _, _ = self.maker.make(seq + 1, task, n_needles=k,
                                                   n_queries=int(self.rng.integers(1, k + 1)))
                x[b] = torch.from_numpy(ids).to(self.device)
                w[b] = torch.where(torch.from_numpy(am[1:]).to(self.device), answer_w, 1.0)
        pos = torch.arange(seq, device=self.device).expand(bsz, seq).clone()
        if pose_max > seq:
            for b in range(bsz):
                if self.rng.random() < p_pose:
                    c = int(self.rng.integers(1, seq))
                    u = int(self.rng.integers(0, pose_max - seq + 1))
                    pos[b, c:] += u
        return x[:, :-1].contiguous(), x[:, 1:].contiguous(), w, pos


def lr_at(frac: float, step: int, args) -> float:
    warm = min(1.0, (step + 1) / args.warmup_steps)
    if frac < 1 - args.warmdown:
        return args.lr * warm
    return args.lr * warm * max(0.0, (1 - frac) / args.warmdown)


@torch.no_grad()
def heldout_eval(model, held: np.ndarray, seq: int, device, max_tokens: int) -> dict:
    model.eval()
    n = min(len(held) - 1, max_tokens) // seq * seq
    x = torch.from_numpy(held[: n + 1].astype(np.int64)).to(device)
    tot, cnt = 0.0, 0
    bs = max(1, 65536 // seq)
    inp, lab = x[:-1].view(-1, seq), x[1:].view(-1, seq)
    for i in range(0, inp.shape[0], bs):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=inp[i:i + bs], use_cache=False).logits
        tot += F.cross_entropy(logits.float().flatten(0, 1), lab[i:i + bs].flatten(), reduction="sum").item()
        cnt += lab[i:i + bs].numel()
    model.train()
    return {"tokens": cnt, "loss": tot / cnt, "nats": tot}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data/tok")
    ap.add_argument("--out", default="runs/tiny")
    ap.add_argument("--minutes", type=float, default=6.5, help="wall-clock training budget")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (CPU tests)")
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--rope-theta", type=float, default=1e6)
    ap.add_argument("--lr", type=float, default=2.5e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=60)
    ap.add_argument("--warmdown", type=float, default=0.35)
    ap.add_argument("--tokens-per-step", type=int, default=131072)
    ap.add_argument("--phases", default="1024:0.35:0.3:0,4096:0.25:0.5:0.5,16384:0.25:0.6:0.5,32768:0.15:0.6:0.5",
                    help="seq:time-fraction:p_needle:p_pose, comma separated")
    ap.add_argument("--pose-max", type=int, default=65536)
    ap.add_argument("--answer-weight", type=float, default=4.0)
    ap.add_argument("--eval-seq", type=int, default=1024)
    ap.add_argument("--eval-tokens", type=int, default=400_000)
    ap.add_argument("--shard", default="15MB")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    t_start = time.time()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    data = Path(args.data)
    tok = Tokenizer.from_file(str(data / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    train = np.load(data / "train.npy")
    held = np.load(data / "heldout.npy")
    stats = json.loads((data / "stats.json").read_text())
    print(f"device {device} train tokens {len(train)} heldout tokens {len(held)}", flush=True)

    cfg = make_config(args, tok.get_vocab_size(), eos)
    model = Qwen3ForCausalLM(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params} ({n_params * 2 / 1e6:.1f} MB bf16)", flush=True)
    check_pose_attention(model, device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    maker = NeedleMaker(tok, train, rng)
    batches = Batches(train, maker, rng, device)
    phases = []
    acc = 0.0
    for ph in args.phases.split(","):
        s, f, pn, pp = ph.split(":")
        acc += float(f)
        phases.append((int(s), acc, float(pn), float(pp)))
    budget = args.minutes * 60.0
    t0 = time.time()
    log, step, tokens = [], 0, 0
    model.train()
    while True:
        elapsed = time.time() - t0
        frac = elapsed / budget
        if frac >= 1.0 or (args.max_steps and step >= args.max_steps):
            break
        seq, _, pn, pp = next((p for p in phases if frac < p[1]), phases[-1])
        bsz = max(1, args.tokens_per_step // seq)
        lr = lr_at(frac, step, args)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y, w, pos = batches.get(bsz, seq, pn, pp, args.pose_max, args.answer_weight)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=x, position_ids=pos, use_cache=False).logits
        ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
        loss = (ce * w.flatten()).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        if step % 25 == 0 or step <= 3:
            with torch.no_grad():
                am = w > 1.0
                ans_loss = (ce.view_as(w)[am].mean().item() if am.any() else float("nan"))
            rec = {"step": step, "t": round(time.time() - t0, 1), "seq": seq, "lr": lr,
                   "loss": round(loss.item(), 4), "lm_loss": round(ce.mean().item(), 4),
                   "answer_loss": round(ans_loss, 4), "gnorm": round(gn.item(), 3),
                   "tok_per_s": round(tokens / (time.time() - t0))}
            if device.type == "cuda":
                rec["mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
            log.append(rec)
            print(json.dumps(rec), flush=True)
    train_s = time.time() - t0
    print(f"trained {step} steps, {tokens} tokens in {train_s:.0f}s", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size=args.shard)
    model.to(torch.float32)
    # Also the v4-style keys real Qwen3 checkpoints carry, so any loader finds rope_theta.
    cj = json.loads((out / "config.json").read_text())
    cj.setdefault("rope_theta", float(args.rope_theta))
    cj.setdefault("rope_scaling", None)
    cj["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cj, indent=2) + "\n")
    GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, do_sample=False,
                     max_new_tokens=128).save_pretrained(out)
    shutil.copy(data / "tokenizer.json", out / "tokenizer.json")
    PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"), eos_token="<|endoftext|>",
                            pad_token="<|endoftext|>", model_max_length=args.pose_max).save_pretrained(out)
    shutil.copy(data / "tokenizer.json", out / "tokenizer.json")  # keep the exact trained file
    print("saved", sorted(p.name for p in out.iterdir()), flush=True)

    # Held-out loss and bits per byte with the bf16 weights as shipped.
    model.to(torch.bfloat16)
    ev = heldout_eval(model, held, args.eval_seq, device, args.eval_tokens)
    frac_tok = ev["tokens"] / len(held)
    held_bytes = stats["heldout"]["bytes"] * frac_tok  # bytes in the evaluated prefix (approx., pro rata)
    ev["bits_per_byte"] = ev["nats"] / math.log(2) / held_bytes
    ev["bytes_per_token"] = stats["heldout"]["bytes_per_token"]
    ev["seq"] = args.eval_seq
    print("heldout", json.dumps(ev), flush=True)
    info = {"args": vars(args), "params": n_params, "steps": step, "tokens": tokens,
            "train_seconds": round(train_s, 1), "total_seconds": round(time.time() - t_start, 1),
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "heldout": ev, "log": log}
    (out / "train_log.json").write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
