"""Find and load a Hugging Face checkpoint: config, generation config, float32 or bf16 weights.

`--model` is a directory, or a model id ("Qwen/Qwen3-0.6B") found in the local Hugging Face cache
(HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub). Nothing is ever downloaded.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import coldkv
from coldkv.errors import ModelLoadError
from coldkv.runtime.config import ModelArgs
from coldkv.runtime.safetensors_io import SafetensorsFile, open_checkpoint


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def resolve_model(model: str | Path | None) -> Path:
    """A checkpoint directory for `model` (None: the bundled model)."""
    if model is None:
        path = Path(coldkv.DEFAULT_MODEL)
        if not (path / "config.json").exists():
            raise ModelLoadError(
                f"the bundled model is not installed ({path} has no config.json); pass --model DIR "
                "or a model id from your Hugging Face cache"
            )
        return path
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{path} is not a Hugging Face checkpoint (no config.json)")
        return path
    text = str(model)
    if path.exists():
        raise ModelLoadError(f"--model {text} is a file; give a checkpoint directory")
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        repo = hf_cache_dir() / ("models--" + text.replace("/", "--"))
        snapshots = repo / "snapshots"
        if snapshots.is_dir():
            ref = repo / "refs" / "main"
            if ref.exists() and (snapshots / ref.read_text().strip()).is_dir():
                return snapshots / ref.read_text().strip()
            revs = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
            if revs:
                return revs[-1]
        raise ModelLoadError(
            f"model {text} is not a directory and not in the Hugging Face cache ({hf_cache_dir()}); "
            "coldkv does not download models"
        )
    raise ModelLoadError(f"model directory {text} does not exist")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return data


def load_args(model_dir: Path) -> ModelArgs:
    """config.json (+ eos ids from generation_config.json, which wins where present)."""
    args = ModelArgs.from_dict(_read_json(model_dir / "config.json"))
    gen = model_dir / "generation_config.json"
    if gen.exists():
        eos = _read_json(gen).get("eos_token_id")
        if eos is not None:
            ids = tuple(int(x) for x in (eos if isinstance(eos, list) else [eos]))
            args = args.replace(eos_token_ids=tuple(dict.fromkeys(ids + args.eos_token_ids)))
    return args


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # [dim]
    wqkv: np.ndarray  # [(n_heads + 2 * n_kv_heads) * head_dim, dim]; q, k, v rows stacked (one GEMM)
    bqkv: np.ndarray | None  # [(n_heads + 2 * n_kv_heads) * head_dim] (Qwen2)
    q_norm: np.ndarray | None  # [head_dim] (Qwen3)
    k_norm: np.ndarray | None  # [head_dim] (Qwen3)
    wo: np.ndarray  # [dim, n_heads * head_dim]
    bo: np.ndarray | None  # [dim]
    mlp_norm: np.ndarray  # [dim]
    w_gate_up: np.ndarray  # [2 * hidden, dim]; gate rows then up rows (one GEMM)
    w_down: np.ndarray  # [dim, hidden]


@dataclass
class Weights:
    embed: np.ndarray  # [vocab, dim]
    layers: list[LayerWeights]
    norm: np.ndarray  # [dim]
    lm_head: np.ndarray  # [vocab, dim]; the same array as `embed` when tied

    @property
    def n_params(self) -> int:
        arrays = [self.embed, self.norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for lw in self.layers:
            arrays += [a for a in vars(lw).values() if a is not None]
        return int(sum(a.size for a in arrays))


MATRIX_DTYPES = ("f32", "bf16", "f16")


def load_weights(model_dir: Path, args: ModelArgs, dtype: str = "f32") -> Weights:
    """Weights with the matrices (projections, embedding, LM head) as float32 ("f32", the CPU
    backend) or as uint16 16-bit bits for the CUDA backend's GEMMs: "bf16" (BF16 tensors as stored,
    others rounded) or "f16" (F16 as stored, others rounded; a value beyond fp16's range is a
    ModelLoadError). Vectors (norm weights, biases) are always float32, exact from any dtype."""
    if dtype not in MATRIX_DTYPES:
        raise ValueError(f"dtype must be one of {MATRIX_DTYPES}, got {dtype!r}")
    files = open_checkpoint(model_dir)
    try:
        return _load_weights(model_dir, args, files, dtype)
    finally:
        for f in set(files.values()):
            f.close()


def _load_weights(model_dir: Path, args: ModelArgs, files: dict[str, SafetensorsFile], dtype: str) -> Weights:
    d, hd = args.hidden_size, args.head_dim
    nq, nkv = args.num_attention_heads * hd, args.num_key_value_heads * hd

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        f: SafetensorsFile | None = files.get(name)
        if f is None:
            raise ModelLoadError(f"checkpoint {model_dir} lacks tensor {name}")
        if f.tensors[name][1] != shape:
            raise ModelLoadError(
                f"tensor {name} has shape {list(f.tensors[name][1])}, config.json implies {list(shape)}"
            )
        if len(shape) == 1 or dtype == "f32":
            return f.get_f32(name)
        return f.get_bf16(name) if dtype == "bf16" else f.get_f16(name)

    def opt(name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        return get(name, shape) if name in files else None

    layers = []
    for i in range(args.num_hidden_layers):
        p = f"model.layers.{i}."
        wqkv = np.concatenate([get(p + "self_attn.q_proj.weight", (nq, d)), get(p + "self_attn.k_proj.weight", (nkv, d)),
                               get(p + "self_attn.v_proj.weight", (nkv, d))])
        bqkv = None
        if args.attention_bias:
            bqkv = np.concatenate([get(p + "self_attn.q_proj.bias", (nq,)), get(p + "self_attn.k_proj.bias", (nkv,)),
                                   get(p + "self_attn.v_proj.bias", (nkv,))])
        i_size = args.intermediate_size
        layers.append(LayerWeights(
            attn_norm=get(p + "input_layernorm.weight", (d,)),
            wqkv=wqkv,
            bqkv=bqkv,
            q_norm=get(p + "self_attn.q_norm.weight", (hd,)) if args.qk_norm else None,
            k_norm=get(p + "self_attn.k_norm.weight", (hd,)) if args.qk_norm else None,
            wo=get(p + "self_attn.o_proj.weight", (d, nq)),
            bo=opt(p + "self_attn.o_proj.bias", (d,)),
            mlp_norm=get(p + "post_attention_layernorm.weight", (d,)),
            w_gate_up=np.concatenate([get(p + "mlp.gate_proj.weight", (i_size, d)),
                                      get(p + "mlp.up_proj.weight", (i_size, d))]),
            w_down=get(p + "mlp.down_proj.weight", (d, i_size)),
        ))
    embed = get("model.embed_tokens.weight", (args.vocab_size, d))
    if args.tie_word_embeddings:
        lm_head = embed
    elif "lm_head.weight" in files:
        lm_head = get("lm_head.weight", (args.vocab_size, d))
    else:
        raise ModelLoadError(f"checkpoint {model_dir} lacks lm_head.weight and config.json does not tie embeddings")
    return Weights(embed=embed, layers=layers, norm=get("model.norm.weight", (d,)), lm_head=lm_head)


def checkpoint_dtype(model_dir: Path) -> str:
    """The storage dtype of the embedding table ("BF16", "F16", "F32"): the checkpoint's own (the
    CUDA backend runs its GEMMs in fp16 for "F16", else in bf16)."""
    files = open_checkpoint(model_dir)
    f = files.get("model.embed_tokens.weight")
    dtype = f.dtype("model.embed_tokens.weight") if f else "?"
    for f in set(files.values()):
        f.close()
    return dtype
