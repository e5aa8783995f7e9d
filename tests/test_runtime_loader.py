"""Config parsing, safetensors reading, model resolution, KV tables."""
import json
import struct

import numpy as np
import pytest

import coldkv
from coldkv.errors import KVTableError, ModelLoadError
from coldkv.runtime.config import ModelArgs
from coldkv.runtime.kv_table import NAMED, resolve_table
from coldkv.runtime.loader import load_args, load_weights, resolve_model
from coldkv.runtime.rope import rope_frequencies
from coldkv.runtime.safetensors_io import SafetensorsFile, bf16_bits_to_f32, save_file
from tinymodel import make_checkpoint, tiny_config


def test_config_families_and_flags():
    q3 = ModelArgs.from_dict(tiny_config("qwen3"))
    assert (q3.architecture, q3.qk_norm, q3.attention_bias) == ("qwen3", True, False)
    ll = ModelArgs.from_dict(tiny_config("llama"))
    assert (ll.architecture, ll.qk_norm, ll.attention_bias) == ("llama", False, False)
    q2 = ModelArgs.from_dict(tiny_config("qwen2"))
    assert (q2.architecture, q2.qk_norm, q2.attention_bias) == ("qwen2", False, True)
    assert q3.n_rep == 2 and q3.eos_token_ids == (0,)


def test_config_derived_head_dim_and_defaults():
    cfg = tiny_config("llama", hidden=256, heads=4, head_dim=None)
    del cfg["num_key_value_heads"]
    args = ModelArgs.from_dict(cfg)
    assert args.head_dim == 64 and args.num_key_value_heads == 4


def test_config_both_rope_styles_agree():
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256}
    a = ModelArgs.from_dict(tiny_config("llama", rope=rope, theta=5e5))
    b = ModelArgs.from_dict(tiny_config("llama", rope=rope, theta=5e5, rope_style="transformers5"))
    assert a.rope == b.rope and a.rope.rope_type == "llama3" and a.rope.theta == 5e5
    old = tiny_config("llama", rope={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512})
    assert ModelArgs.from_dict(old).rope.rope_type == "yarn"


@pytest.mark.parametrize("change, match", [
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, "unsupported architecture MistralForCausalLM"),
    ({"architectures": None}, "unsupported architecture"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "RoPE type 'longrope'"),
    ({"head_dim": 80}, "head_dim 80"),
    ({"num_key_value_heads": 3}, "multiple"),
    ({"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
    ({"hidden_size": None}, "bad value"),
])
def test_config_refusals(change, match):
    cfg = tiny_config("qwen3")
    cfg.update(change)
    with pytest.raises(ModelLoadError, match=match):
        ModelArgs.from_dict(cfg)


def test_config_missing_key():
    cfg = tiny_config("qwen3")
    del cfg["vocab_size"]
    with pytest.raises(ModelLoadError, match="vocab_size"):
        ModelArgs.from_dict(cfg)


def test_rope_llama3_leaves_high_frequencies_and_scales_low():
    args = ModelArgs.from_dict(tiny_config("llama", rope={"rope_type": "llama3", "factor": 8.0,
                                                          "original_max_position_embeddings": 64}))
    inv, attn = rope_frequencies(args.rope, 64)
    base = 1.0 / 10000.0 ** (np.arange(0, 64, 2) / 64)
    assert attn == 1.0
    assert inv[0] == base[0]  # short wavelengths untouched
    assert np.isclose(inv[-1], base[-1] / 8)  # long wavelengths divided by factor


def test_bf16_bits():
    bits = np.array([0x3F80, 0xBF80, 0x4049, 0x0000], np.uint16)
    assert bf16_bits_to_f32(bits).tolist() == [1.0, -1.0, 3.140625, 0.0]


def test_safetensors_roundtrip_bf16_and_f16(tmp_path):
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    save_file({"a": x}, tmp_path / "a.safetensors", bf16=True)
    save_file({"b": x.astype(np.float16)}, tmp_path / "b.safetensors")
    fa, fb = SafetensorsFile(tmp_path / "a.safetensors"), SafetensorsFile(tmp_path / "b.safetensors")
    assert fa.dtype("a") == "BF16" and fb.dtype("b") == "F16"
    np.testing.assert_allclose(fa.get_f32("a"), x, rtol=2**-8)
    np.testing.assert_allclose(fb.get_f32("b"), x, rtol=2**-10)


def test_safetensors_interop_with_the_library(tmp_path):
    from safetensors.numpy import load_file, save_file as st_save

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    st_save({"x": x}, str(tmp_path / "lib.safetensors"))
    np.testing.assert_array_equal(SafetensorsFile(tmp_path / "lib.safetensors").get_f32("x"), x)
    save_file({"x": x}, tmp_path / "ours.safetensors")
    np.testing.assert_array_equal(load_file(str(tmp_path / "ours.safetensors"))["x"], x)


def test_truncated_and_garbage_safetensors(tmp_path):
    d = make_checkpoint(tmp_path / "m", "qwen3")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_weights(d, load_args(d))
    (d / "model.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load_weights(d, load_args(d))
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"{oops")
    with pytest.raises(ModelLoadError, match="malformed"):
        load_weights(d, load_args(d))


def test_sharded_bf16_equals_single(tmp_path):
    one = make_checkpoint(tmp_path / "one", "qwen2", bf16=True)
    three = make_checkpoint(tmp_path / "three", "qwen2", bf16=True, shards=3)
    assert (three / "model.safetensors.index.json").exists() and not (three / "model.safetensors").exists()
    a, b = load_weights(one, load_args(one)), load_weights(three, load_args(three))
    np.testing.assert_array_equal(a.layers[1].wqkv, b.layers[1].wqkv)
    np.testing.assert_array_equal(a.lm_head, b.lm_head)
    assert a.layers[0].bqkv is not None


def test_gemm_dtypes_keep_fp16_checkpoints_as_stored(tmp_path):
    """The CUDA backend's weights: an fp16 checkpoint's matrices as its own bits ("f16"), a bf16
    one's as its own ("bf16"); vectors float32 either way; rounding to fp16 refuses overflow."""
    from coldkv.runtime.loader import checkpoint_dtype

    f16 = make_checkpoint(tmp_path / "f16", "qwen2", f16=True)
    b16 = make_checkpoint(tmp_path / "b16", "qwen2", bf16=True)
    assert (checkpoint_dtype(f16), checkpoint_dtype(b16)) == ("F16", "BF16")
    ref = load_weights(f16, load_args(f16))  # float32, exact widening
    w = load_weights(f16, load_args(f16), dtype="f16")
    np.testing.assert_array_equal(w.layers[1].wqkv.view(np.float16).astype(np.float32), ref.layers[1].wqkv)
    np.testing.assert_array_equal(w.embed.view(np.float16).astype(np.float32), ref.embed)
    assert w.layers[1].wqkv.dtype == np.uint16 and w.layers[0].bqkv.dtype == np.float32
    np.testing.assert_array_equal(w.layers[0].bqkv, ref.layers[0].bqkv)
    wb = load_weights(b16, load_args(b16), dtype="bf16")
    np.testing.assert_array_equal(bf16_bits_to_f32(wb.layers[0].w_down), load_weights(b16, load_args(b16)).layers[0].w_down)
    big = {n: t.copy() for n, t in [("model.embed_tokens.weight", np.full((4, 2), 70000.0, np.float32))]}
    save_file(big, tmp_path / "big.safetensors")
    f = SafetensorsFile(tmp_path / "big.safetensors")
    with pytest.raises(ModelLoadError, match="beyond fp16's range"):
        f.get_f16("model.embed_tokens.weight")
    f.close()
    with pytest.raises(ValueError, match="dtype"):
        load_weights(f16, load_args(f16), dtype="fp8")


def test_missing_shard_and_tensor(tmp_path):
    d = make_checkpoint(tmp_path / "m", "llama", shards=2)
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="missing"):
        load_weights(d, load_args(d))
    d2 = make_checkpoint(tmp_path / "m2", "llama")
    cfg = json.loads((d2 / "config.json").read_text())
    cfg["architectures"] = ["Qwen3ForCausalLM"]  # Qwen3 needs q_norm, which a Llama checkpoint lacks
    (d2 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="q_norm"):
        load_weights(d2, load_args(d2))
    cfg["architectures"], cfg["intermediate_size"] = ["LlamaForCausalLM"], 128
    (d2 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="shape"):
        load_weights(d2, load_args(d2))


def test_tied_embeddings(tmp_path):
    d = make_checkpoint(tmp_path / "m", "qwen3", tie=True)
    w = load_weights(d, load_args(d))
    assert w.lm_head is w.embed
    cfg = json.loads((d / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="lm_head"):
        load_weights(d, load_args(d))


def test_generation_config_eos(tmp_path):
    d = make_checkpoint(tmp_path / "m", "qwen3", generation_eos=[5, 0])
    assert load_args(d).eos_token_ids == (5, 0)


def test_resolve_model(tmp_path, monkeypatch):
    d = make_checkpoint(tmp_path / "m", "qwen3")
    assert resolve_model(str(d)) == d
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model(str(tmp_path))
    # a model id in the HF cache: hub/models--org--name/snapshots/<rev>, refs/main names the revision
    snap = tmp_path / "hf" / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    make_checkpoint(snap, "llama")
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    assert resolve_model("acme/tiny") == snap
    with pytest.raises(ModelLoadError, match="Hugging Face cache"):
        resolve_model("acme/other")
    monkeypatch.setattr(coldkv, "DEFAULT_MODEL", tmp_path / "absent")
    with pytest.raises(ModelLoadError, match="--model"):
        resolve_model(None)


def test_malformed_config_json(tmp_path):
    d = make_checkpoint(tmp_path / "m", "qwen3")
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_args(d)


def test_kv_tables(tmp_path):
    assert resolve_table("nvfp4", 3).layers == (("nvfp4", "iso3"),) * 3
    assert resolve_table("bf16", 2).layers == (NAMED["bf16"],) * 2
    d = resolve_table("default", 4)
    assert d.layers[0] == ("int8", "int8") and d.layers[1] == ("nvfp4", "iso3") and d.layers[3] == ("int8", "int8")
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"default": "nvfp4", "layers": {"0": "bf16", "1-2": {"k": "int8", "v": "iso3"},
                                                           "-1": "int8"}}))
    t = resolve_table(str(f), 5)
    assert t.layers == (("bf16", "bf16"), ("int8", "iso3"), ("int8", "iso3"), ("nvfp4", "iso3"), ("int8", "int8"))
    assert "layers" in t.summary()
    f.write_text(json.dumps({"layers": ["bf16", "iso3"]}))
    assert resolve_table(str(f), 2).layers == (("bf16", "bf16"), ("iso3", "iso3"))
    # a checkpoint's own table wins for `default`
    (tmp_path / "kv_table.json").write_text(json.dumps({"default": "int8"}))
    assert resolve_table("default", 2, tmp_path).layers == (("int8", "int8"),) * 2


@pytest.mark.parametrize("content, match", [
    ({"layers": ["bf16"]}, "lists 1 layers"),
    ({"layers": {"0": "bf16"}}, "no format for layers 1"),
    ({"layers": {"7": "bf16"}, "default": "int8"}, "outside"),
    ({"default": "fp8"}, "unknown format 'fp8'"),
    ({"default": {"k": "int8"}}, "expected a format name"),
    ({"layers": {"x": "int8"}}, "bad layer key"),
    ([1, 2], "JSON object"),
])
def test_kv_table_file_errors(tmp_path, content, match):
    f = tmp_path / "t.json"
    f.write_text(json.dumps(content))
    with pytest.raises(KVTableError, match=match):
        resolve_table(str(f), 2)


def test_kv_table_unknown_name_and_missing_file(tmp_path):
    with pytest.raises(KVTableError, match="unknown KV table 'fp8'"):
        resolve_table("fp8", 2)
    with pytest.raises(KVTableError, match="does not exist"):
        resolve_table(str(tmp_path / "none.json"), 2)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(KVTableError, match="not valid JSON"):
        resolve_table(str(tmp_path / "bad.json"), 2)
