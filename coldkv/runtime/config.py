"""ModelArgs: the parts of a Hugging Face config.json the runtime uses, validated.

Unknown keys are dropped (config.json files carry dozens we do not need); unsupported architectures
and features are refused by name, so a checkpoint never silently runs with the wrong math.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from coldkv.errors import ModelLoadError

# HF `architectures[0]` -> our family name. The three differ only in q/k norm and qkv bias,
# which ModelArgs carries as flags (a Llama checkpoint with attention_bias=true also works).
ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}
ROPE_TYPES = ("default", "llama3", "yarn")


@dataclass(frozen=True)
class RopeArgs:
    rope_type: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class ModelArgs:
    architecture: str  # "qwen3" | "llama" | "qwen2"
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections (o_proj bias if the checkpoint has one)
    rope: RopeArgs = field(default_factory=RopeArgs)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"

    @property
    def n_rep(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> "ModelArgs":
        """Parse a config.json dict. Unknown keys are ignored; unsupported features raise ModelLoadError."""
        archs = cfg.get("architectures") or []
        arch_name = archs[0] if archs else None
        if arch_name not in ARCHITECTURES:
            model_type = cfg.get("model_type", "?")
            raise ModelLoadError(
                f"unsupported architecture {arch_name or '(none)'} (model_type {model_type}); "
                f"coldkv runs {', '.join(ARCHITECTURES)}"
            )
        arch = ARCHITECTURES[arch_name]
        _refuse_unsupported(cfg)
        try:
            hidden = int(cfg["hidden_size"])
            n_heads = int(cfg["num_attention_heads"])
            n_kv = int(cfg.get("num_key_value_heads") or n_heads)
            head_dim = int(cfg.get("head_dim") or hidden // n_heads)
            args = cls(
                architecture=arch,
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=n_heads,
                num_key_value_heads=n_kv,
                vocab_size=int(cfg["vocab_size"]),
                head_dim=head_dim,
                max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                qk_norm=arch == "qwen3",
                attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
                rope=_parse_rope(cfg),
                bos_token_id=_opt_int(cfg.get("bos_token_id")),
                eos_token_ids=_int_tuple(cfg.get("eos_token_id")),
                torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
            )
        except KeyError as exc:
            raise ModelLoadError(f"config.json lacks required key {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"config.json has a bad value: {exc}") from None
        args.validate()
        return args

    def validate(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "vocab_size", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ModelLoadError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelLoadError(
                f"config.json: num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 64:
            # KV pages hold 64-value groups (the c4g64 cold format): head_dim 64, 128, 256, ...
            raise ModelLoadError(f"unsupported head_dim {self.head_dim}: coldkv's KV pages need a multiple of 64")

    def replace(self, **changes: Any) -> "ModelArgs":
        return dataclasses.replace(self, **changes)


def _opt_int(v: Any) -> int | None:
    if isinstance(v, list):
        v = v[0] if v else None
    return None if v is None else int(v)


def _int_tuple(v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    if isinstance(v, (list, tuple)):
        return tuple(int(x) for x in v)
    return (int(v),)


def _refuse_unsupported(cfg: dict[str, Any]) -> None:
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ModelLoadError(f"unsupported hidden_act {act!r}; coldkv runs SwiGLU MLPs (silu)")
    if cfg.get("use_sliding_window"):
        raise ModelLoadError("unsupported feature use_sliding_window=true (sliding-window attention)")
    if cfg.get("mlp_bias"):
        raise ModelLoadError("unsupported feature mlp_bias=true")
    if float(cfg.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ModelLoadError("unsupported feature partial_rotary_factor != 1")
    if cfg.get("quantization_config"):
        method = cfg["quantization_config"].get("quant_method", "?")
        raise ModelLoadError(f"unsupported feature quantization_config ({method}); use a bf16/fp16/fp32 checkpoint")
    layer_types = cfg.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise ModelLoadError("unsupported feature layer_types other than full_attention")


def _parse_rope(cfg: dict[str, Any]) -> RopeArgs:
    """Both styles: `rope_theta` + `rope_scaling` (most checkpoints) and transformers-5 `rope_parameters`."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    if not params:
        params = dict(scaling)
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in ROPE_TYPES:
        raise ModelLoadError(f"unsupported RoPE type {rope_type!r}; coldkv runs {', '.join(ROPE_TYPES)}")
    if rope_type == "default":
        return RopeArgs(theta=float(theta))
    # As transformers 5 standardizes it: the pretraining length defaults to a top-level
    # original_max_position_embeddings, else max_position_embeddings.
    omp = params.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings") \
        or cfg.get("max_position_embeddings")
    if omp is None:
        raise ModelLoadError(f"config.json: RoPE {rope_type} needs original_max_position_embeddings")
    factor = params.get("factor")
    if rope_type == "llama3":
        if factor is None:
            raise ModelLoadError("config.json: RoPE llama3 needs a 'factor'")
        return RopeArgs(
            rope_type="llama3", theta=float(theta), factor=float(factor),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(omp),
        )
    if factor is None:  # DeepSeek-style: the ratio of the context lengths
        factor = float(cfg.get("max_position_embeddings") or omp) / float(omp)
    opt = lambda k: None if params.get(k) is None else float(params[k])  # noqa: E731
    return RopeArgs(
        rope_type="yarn", theta=float(theta), factor=float(factor),
        original_max_position_embeddings=int(omp),
        beta_fast=float(params.get("beta_fast") or 32.0), beta_slow=float(params.get("beta_slow") or 1.0),
        attention_factor=opt("attention_factor"), mscale=opt("mscale"), mscale_all_dim=opt("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
    )
