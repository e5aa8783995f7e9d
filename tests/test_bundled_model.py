"""The bundled checkpoint (coldkv.DEFAULT_MODEL): shipped files, architecture, size, tokenizer,
safetensors headers (read by hand, not through a library) against config.json, and a golden greedy
retrieval through coldkv's own loader and engine (and through transformers when it is installed).
"""
import json
import struct
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer

import coldkv

MODEL = Path(coldkv.DEFAULT_MODEL)
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MAX_BYTES = 40_000_000  # 40 MB, the whole directory

# examples/prompt.txt is a 591-token passkey prompt (tools/make_examples.py); the pass key is 5258698.
# Greedy continuation, recorded with transformers 5.24 (float32 on CPU) and with coldkv (bf16 KV).
GOLDEN_PROMPT = "prompt.txt"
GOLDEN_TOKENS = [222, 22, 19, 22, 25, 23, 26, 25, 15]  # " 5258698."
GOLDEN_TEXT = " 5258698."


def _config() -> dict:
    return json.loads((MODEL / "config.json").read_text())


def _safetensors_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def _expected_shapes(c: dict) -> dict[str, list[int]]:
    h, d, nq, nkv, ff = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    shapes = {"model.embed_tokens.weight": [c["vocab_size"], h], "model.norm.weight": [h]}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
            p + "self_attn.q_proj.weight": [nq * d, h], p + "self_attn.k_proj.weight": [nkv * d, h],
            p + "self_attn.v_proj.weight": [nkv * d, h], p + "self_attn.o_proj.weight": [h, nq * d],
            p + "self_attn.q_norm.weight": [d], p + "self_attn.k_norm.weight": [d],
            p + "mlp.gate_proj.weight": [ff, h], p + "mlp.up_proj.weight": [ff, h], p + "mlp.down_proj.weight": [h, ff],
        })
    if not c.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = [c["vocab_size"], h]
    return shapes


def test_shipped_files():
    for name in ("config.json", "tokenizer.json", "generation_config.json", "MODEL_CARD.md"):
        assert (MODEL / name).is_file(), name
    assert list(MODEL.glob("*.safetensors"))
    assert (EXAMPLES / "prompt.txt").is_file()


def test_config_is_qwen3_with_gqa_and_head_dim_128():
    c = _config()
    assert c["model_type"] == "qwen3" and c["architectures"] == ["Qwen3ForCausalLM"]
    assert c["head_dim"] == 128
    assert c["num_hidden_layers"] >= 8
    assert c["num_key_value_heads"] < c["num_attention_heads"]
    assert c["num_attention_heads"] % c["num_key_value_heads"] == 0
    assert c["tie_word_embeddings"] is True
    # Both rope spellings agree (v4-style rope_theta for loaders that read it, v5 rope_parameters).
    assert c["rope_theta"] == c["rope_parameters"]["rope_theta"]
    assert c["rope_parameters"]["rope_type"] == "default" and c["rope_scaling"] is None


def test_size_at_most_40_mb():
    total = sum(p.stat().st_size for p in MODEL.rglob("*") if p.is_file())
    assert total <= MAX_BYTES, f"{total} bytes"


def test_tokenizer_loads_and_matches_config():
    tok = HFTokenizer.from_file(str(MODEL / "tokenizer.json"))
    c = _config()
    g = json.loads((MODEL / "generation_config.json").read_text())
    eos = tok.token_to_id("<|endoftext|>")
    assert eos == c["eos_token_id"] == g["eos_token_id"] == 0
    assert tok.get_vocab_size() == c["vocab_size"]
    text = "Harbor \\Har\"bor\\, n. The pass key is 4829173. 你好"
    enc = tok.encode(text)
    assert tok.decode(enc.ids) == text
    # digits are one token each (needle values are 7 digit tokens)
    assert tok.encode("4829173").tokens == list("4829173")


def test_safetensors_headers_match_config():
    c = _config()
    expected = _expected_shapes(c)
    files = sorted(MODEL.glob("*.safetensors"))
    index_path = MODEL / "model.safetensors.index.json"
    if len(files) > 1 or index_path.exists():
        weight_map = json.loads(index_path.read_text())["weight_map"]
        assert set(weight_map.values()) == {f.name for f in files}
    else:
        weight_map = None
    seen = {}
    for f in files:
        header, start = _safetensors_header(f)
        header.pop("__metadata__", None)
        end = 0
        spans = []
        for name, t in header.items():
            assert t["dtype"] == "BF16", name
            n = 1
            for s in t["shape"]:
                n *= s
            a, b = t["data_offsets"]
            assert b - a == 2 * n, name
            spans.append((a, b))
            seen[name] = t["shape"]
            if weight_map is not None:
                assert weight_map[name] == f.name
            end = max(end, b)
        spans.sort()
        assert spans[0][0] == 0 and all(x[1] == y[0] for x, y in zip(spans, spans[1:])), "gaps or overlaps"
        assert f.stat().st_size == start + end
    assert seen == expected
    if weight_map is not None:
        assert set(weight_map) == set(expected)


def test_model_card_numbers_come_from_the_results():
    card = (MODEL / "MODEL_CARD.md").read_text()
    for word in ("GPL-2.0-or-later", "PSF-2.0", "GPL-3.0-or-later", "Public domain", "bits per byte", "YaRN"):
        assert word in card, word
    res = Path(__file__).resolve().parent.parent / "bench" / "results" / "model_needle.json"
    data = json.loads(res.read_text())
    assert data["device"] and data["versions"]["transformers"]
    acc = {(s["setting"], s["task"], s["length"]): s["accuracy"] for s in data["summary"]}
    for length in (4096, 8192, 16384, 32768):
        assert acc[("plain", "passkey", length)] >= 0.95 and acc[("plain", "niah", length)] >= 0.95


@pytest.fixture(scope="module")
def golden_ids():
    tok = HFTokenizer.from_file(str(MODEL / "tokenizer.json"))
    ids = tok.encode((EXAMPLES / GOLDEN_PROMPT).read_text(encoding="utf-8")).ids
    assert len(ids) == 591
    return ids


def test_golden_greedy_through_coldkv(golden_ids):
    """coldkv's loader + CPU engine retrieve the pass key of examples/prompt.txt, bf16 KV and the
    default compressed table."""
    from coldkv.runtime.backend import CPUBackend
    from coldkv.runtime.engine import generate
    from coldkv.runtime.kv_table import resolve_table
    from coldkv.runtime.tokenizer import Tokenizer

    backend = CPUBackend(MODEL)
    tok = Tokenizer.from_dir(MODEL)
    n = backend.args.num_hidden_layers
    res = generate(backend, tok, golden_ids, table=resolve_table("bf16", n, MODEL), max_new_tokens=len(GOLDEN_TOKENS))
    assert res.tokens == GOLDEN_TOKENS and res.text == GOLDEN_TEXT
    res = generate(backend, tok, golden_ids, table=resolve_table("default", n, MODEL), max_new_tokens=len(GOLDEN_TOKENS))
    assert GOLDEN_TEXT.strip(" .") in res.text


@pytest.mark.transformers
def test_golden_greedy_through_transformers(golden_ids):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(MODEL)
    assert tok.eos_token_id == 0
    model = transformers.Qwen3ForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([golden_ids]), max_new_tokens=len(GOLDEN_TOKENS), do_sample=False)
    assert out[0, len(golden_ids):].tolist() == GOLDEN_TOKENS


def test_tokenizer_from_dir_takes_a_str_or_a_path():
    """bench/startup.py's HF child passes argv's str (it failed on `str / str` before 9aba3f8)."""
    from coldkv.runtime.tokenizer import Tokenizer

    text = "The pass key is 4829173."
    assert Tokenizer.from_dir(str(MODEL)).encode(text) == Tokenizer.from_dir(MODEL).encode(text)
