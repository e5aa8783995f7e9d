"""Tiny random-weight HF checkpoints for tests: config.json, safetensors, tokenizer.json.

`make_checkpoint(dir, arch=..., ...)` writes a directory the loader reads like a real one. The
tokenizer is a byte-level BPE trained with `tokenizers` on a few sentences (fast, deterministic).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from coldkv.runtime.safetensors_io import save_file

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A paged KV cache stores keys and values in pages of sixty-four tokens.",
    "Compressed caches keep long contexts on one GPU without losing the answer.",
    "def main():\n    print('hello, world')\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 1234567.",
    "Ünïcödé text, 中文字符, and emoji 🙂 are bytes too.",
] * 4
EOS = "<|endoftext|>"
BOS = "<|begin|>"


@functools.lru_cache(maxsize=None)
def tokenizer_json(vocab_size: int = 320, bos: bool = False) -> str:
    """A byte-level BPE tokenizer.json (vocab_size includes the special tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, BOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    if bos:  # Llama style: the post-processor prepends BOS, as transformers' tokenizer does
        bos_id = tok.token_to_id(BOS)
        tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, bos_id)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok.to_str()


def tiny_config(arch: str = "qwen3", *, vocab_size: int = 320, hidden: int = 64, layers: int = 2,
                heads: int = 4, kv_heads: int = 2, head_dim: int | None = 64, intermediate: int = 96,
                tie: bool = False, rope: dict | None = None, max_pos: int = 2048, theta: float = 10000.0,
                rope_style: str = "classic") -> dict:
    cfg = {
        "architectures": {"qwen3": ["Qwen3ForCausalLM"], "llama": ["LlamaForCausalLM"],
                          "qwen2": ["Qwen2ForCausalLM"]}[arch],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab_size,
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": tie,
        "bos_token_id": 1 if arch == "llama" else None,
        "eos_token_id": 0,
        "torch_dtype": "float32",
        "some_future_key": {"ignored": True},
    }
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    if rope_style == "classic":
        cfg["rope_theta"] = theta
        if rope:
            cfg["rope_scaling"] = rope
    else:  # transformers 5
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": theta, **(rope or {})}
    return cfg


def random_weights(cfg: dict, seed: int = 0, std: float = 0.15) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d, nl = cfg["hidden_size"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    nq, nkv, i = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["intermediate_size"]
    arch = cfg["model_type"]

    def w(*shape: int, scale: float = std) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    t = {"model.embed_tokens.weight": w(cfg["vocab_size"], d, scale=1.0), "model.norm.weight": norm(d)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = w(cfg["vocab_size"], d)
    for L in range(nl):
        p = f"model.layers.{L}."
        t[p + "input_layernorm.weight"] = norm(d)
        t[p + "post_attention_layernorm.weight"] = norm(d)
        t[p + "self_attn.q_proj.weight"] = w(nq, d)
        t[p + "self_attn.k_proj.weight"] = w(nkv, d)
        t[p + "self_attn.v_proj.weight"] = w(nkv, d)
        t[p + "self_attn.o_proj.weight"] = w(d, nq)
        if arch == "qwen2":
            t[p + "self_attn.q_proj.bias"] = w(nq)
            t[p + "self_attn.k_proj.bias"] = w(nkv)
            t[p + "self_attn.v_proj.bias"] = w(nkv)
        if arch == "qwen3":
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "mlp.gate_proj.weight"] = w(i, d)
        t[p + "mlp.up_proj.weight"] = w(i, d)
        t[p + "mlp.down_proj.weight"] = w(d, i)
    return t


def write_tokenizer(path: Path, vocab_size: int = 320, bos: bool = False) -> None:
    (Path(path) / "tokenizer.json").write_text(tokenizer_json(vocab_size, bos))


def make_checkpoint(path: Path, arch: str = "qwen3", *, seed: int = 0, bf16: bool = False, f16: bool = False,
                    shards: int = 1, generation_eos: list[int] | None = None, **config_kw) -> Path:
    """Write a tiny checkpoint into `path` (created); returns it. Tensors are F32, or BF16 (bf16) or
    F16 (f16) as HF's save_pretrained writes them for that dtype."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(arch, **config_kw)
    tensors = random_weights(cfg, seed)
    if f16:
        tensors = {n: t.astype(np.float16) for n, t in tensors.items()}
        cfg["torch_dtype"] = "float16"
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    if shards == 1:
        save_file(tensors, path / "model.safetensors", bf16=bf16)
    else:
        names = list(tensors)
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[s::shards]}
            save_file(part, path / fname, bf16=bf16)
            weight_map.update({n: fname for n in part})
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    write_tokenizer(path, cfg["vocab_size"], bos=arch == "llama")
    if generation_eos is not None:
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    return path


GOLDEN_PROMPT_TEXT = "The quick brown fox"
