"""The CUDA backend against the CPU backend and HF transformers (GPU only: skipped without one).

Bound: the CUDA backend rounds every GEMM input row to bf16 (the CPU keeps float32), so logits
differ by about bf16's relative step (2^-8) times the size of the terms summed; we hold the
max-abs logit difference to LOGIT_BOUND x the logits' standard deviation. Greedy tokens are
compared where the choice is not a near-tie: up to the first step whose top-2 margin (CPU side)
is below twice the measured difference.
"""
from pathlib import Path

import numpy as np
import pytest

import coldkv
from coldkv.runtime.backend import CPUBackend
from coldkv.runtime.engine import generate
from coldkv.runtime.kv_table import resolve_table
from coldkv.runtime.tokenizer import Tokenizer
from tinymodel import make_checkpoint

pytestmark = pytest.mark.gpu
LOGIT_BOUND = 0.05
TABLES = ("bf16", "int8", "nvfp4", "default")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _prompt(tok, n=None):
    ids = tok.encode((EXAMPLES / "prompt.txt").read_text())
    return ids if n is None else ids[:n]


def _cuda(d, **kw):
    from coldkv.runtime.cuda_backend import CUDABackend

    return CUDABackend(d, **kw)


def _teacher_forced(backend, table, seq, n_prompt):
    """Logits after the prompt (one chunked prefill) and after each later token (decode steps)."""
    cache = backend.new_cache(table, len(seq))
    out = [backend.forward(np.array(seq[:n_prompt]), cache)]
    out += [backend.forward(np.array([t]), cache) for t in seq[n_prompt:-1]]
    return np.stack(out)


def _agree_until_near_tie(ref_logits, ours_tokens, ref_tokens, tol):
    n = 0
    for lg, a, b in zip(ref_logits, ours_tokens, ref_tokens):
        top2 = np.sort(lg)[-2:]
        if top2[1] - top2[0] < 2 * tol:
            break
        assert a == b, f"greedy token {n} differs ({a} vs {b}) with a top-2 margin of {top2[1] - top2[0]:.3f}"
        n += 1
    return n


@pytest.fixture(scope="module")
def bundled():
    d = coldkv.DEFAULT_MODEL
    if not (d / "config.json").exists():
        pytest.skip("bundled model not installed")
    return d, Tokenizer.from_dir(d), CPUBackend(d), _cuda(d)


@pytest.mark.parametrize("name", TABLES + ("kv_table_mixed.json",))
def test_bundled_greedy_equals_cpu(bundled, name):
    d, tok, cpu, gpu = bundled
    table = resolve_table(str(EXAMPLES / name) if name.endswith(".json") else name, cpu.args.num_hidden_layers, d)
    prompt = _prompt(tok)
    a = generate(cpu, tok, prompt, table=table, max_new_tokens=24)
    b = generate(gpu, tok, prompt, table=table, max_new_tokens=24)
    seq = prompt + a.tokens
    lc = _teacher_forced(cpu, table, seq, len(prompt))
    lg = _teacher_forced(gpu, table, seq, len(prompt))
    diff = float(np.abs(lc - lg).max())
    print(f"\n{name}: CPU {a.text!r} CUDA {b.text!r}; logits max-abs diff {diff:.3g} (std {lc.std():.2f})")
    assert diff < LOGIT_BOUND * lc.std()
    assert a.tokens == b.tokens


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
@pytest.mark.parametrize("name", TABLES)
def test_random_checkpoints_close_to_cpu(tmp_path, arch, name):
    d = make_checkpoint(tmp_path / arch, arch, bf16=True, hidden=128, heads=4, kv_heads=2, head_dim=64,
                        layers=2, intermediate=192)
    cpu, gpu = CPUBackend(d), _cuda(d)
    table = resolve_table(name, cpu.args.num_hidden_layers)
    seq = [int(t) for t in np.random.default_rng(3).integers(0, 320, 150)]  # 3 pages; 20 decode steps
    lc, lg = _teacher_forced(cpu, table, seq, 130), _teacher_forced(gpu, table, seq, 130)
    diff = float(np.abs(lc - lg).max())
    msg = f"\n{arch} {name}: vs CPU logits max-abs diff {diff:.3g} (std {lc.std():.2f})"
    if name == "bf16":  # and against HF transformers on the GPU (fp32 compute, the same bf16 weights)
        torch = pytest.importorskip("torch")
        transformers = pytest.importorskip("transformers")
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa")
        with torch.no_grad():
            ref = hf.cuda().eval()(torch.tensor([seq]).cuda()).logits[0, 129:-1].float().cpu().numpy()
        hf_diff = float(np.abs(lg - ref).max())
        msg += f"; vs HF on CUDA {hf_diff:.3g}"
        assert hf_diff < LOGIT_BOUND * ref.std()
    print(msg)
    assert diff < LOGIT_BOUND * lc.std()


def test_graph_replay_equals_eager_and_trim(bundled):
    """Captured decode steps give bit-identical logits to the same steps launched one by one; trim
    rolls the cache back so a replayed step reproduces the logits it gave the first time."""
    d, tok, cpu, gpu = bundled
    eager = _cuda(d, graphs=False)
    table = resolve_table("nvfp4", cpu.args.num_hidden_layers)
    seq = _prompt(tok, 200) + list(range(100, 140))
    a = _teacher_forced(gpu, table, seq, 200)
    b = _teacher_forced(eager, table, seq, 200)
    np.testing.assert_array_equal(a, b)
    cache = gpu.new_cache(table, len(seq))
    gpu.forward(np.array(seq[:200]), cache)
    first = [gpu.forward(np.array([t]), cache) for t in seq[200:210]]
    cache.trim(5)
    again = [gpu.forward(np.array([t]), cache) for t in seq[205:210]]
    np.testing.assert_array_equal(np.stack(first[5:]), np.stack(again))


def test_cached_decode_equals_uncached(bundled):
    d, tok, cpu, gpu = bundled
    table = resolve_table("bf16", cpu.args.num_hidden_layers)
    seq = _prompt(tok, 100)
    full = gpu.forward(np.array(seq), gpu.new_cache(table, len(seq)), all_logits=True)
    step = _teacher_forced(gpu, table, seq + [0], 60)
    np.testing.assert_allclose(step, full[59:], atol=LOGIT_BOUND * full.std() / 5)


def test_device_cache_pages_match_cpu_codec(bundled):
    """The pages the CUDA backend wrote hold the same K/V (within the bf16 GEMM-input rounding) as
    the CPU backend's, for every format: same layout, same block table semantics."""
    d, tok, cpu, gpu = bundled
    seq = _prompt(tok, 130)
    for name in ("bf16", "int8", "nvfp4"):
        table = resolve_table(name, cpu.args.num_hidden_layers)
        cc, gc = cpu.new_cache(table, 130), gpu.new_cache(table, 130)
        cpu.forward(np.array(seq), cc)
        gpu.forward(np.array(seq), gc)
        for layer in (0, cpu.args.num_hidden_layers - 1):
            for x, y in zip(cc.dense(layer), gc.dense(layer)):
                # relative RMS: a value near a code boundary may take the other code (one step)
                rel = np.linalg.norm(x - y) / np.linalg.norm(x)
                assert rel < {"bf16": 0.01, "int8": 0.02, "nvfp4": 0.1}[name], (name, layer, rel)


def test_hf_transformers_greedy_on_cuda(bundled):
    """HF transformers (fp32 compute on the bundled model's bf16 weights) vs the CUDA backend."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d, tok, cpu, gpu = bundled
    prompt = tok.encode("The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa")
    hf_model = hf_model.cuda().eval()
    with torch.no_grad():
        hf = hf_model.generate(torch.tensor([prompt]).cuda(), max_new_tokens=32, min_new_tokens=32,
                               do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        ref = hf_model(torch.tensor([prompt + hf]).cuda()).logits[0].float().cpu().numpy()
    table = resolve_table("bf16", cpu.args.num_hidden_layers)
    ours = _teacher_forced(gpu, table, prompt + hf, len(prompt))
    diff = float(np.abs(ours - ref[len(prompt) - 1:-1]).max())
    got = generate(gpu, tok, prompt, table=table, max_new_tokens=32).tokens
    n = _agree_until_near_tie(ref[len(prompt) - 1:], got, hf, diff)
    print(f"\nHF on CUDA: logits max-abs diff {diff:.3g} (std {ref.std():.2f}); greedy identical for {n}/32 tokens")
    assert diff < LOGIT_BOUND * ref.std()
    assert n >= 16
