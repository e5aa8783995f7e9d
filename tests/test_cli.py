import json
import os

import pytest
from typer.testing import CliRunner

import coldkv
from coldkv import __version__
from coldkv.cli import app
from tinymodel import GOLDEN_PROMPT_TEXT, make_checkpoint

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"coldkv {__version__}"


def test_help_lists_usage():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "Usage" in result.stdout


# ------------------------------------------------------------------------------ generate / info

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("cli") / "m", "qwen3")


@pytest.fixture
def prompt(tmp_path):
    p = tmp_path / "prompt.txt"
    p.write_text(GOLDEN_PROMPT_TEXT)
    return p


def _json(result):
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_generate_json(model_dir, prompt):
    r = runner.invoke(app, ["generate", str(prompt), "--model", str(model_dir), "-n", "6", "--kv-table", "bf16",
                            "--json", "--device", "cpu"])
    out = _json(r)
    for key in ("text", "tokens", "prompt_tokens", "prefill_tokens_per_s", "decode_tokens_per_s", "kv_bytes",
                "kv_bytes_per_token", "kv_table"):
        assert key in out
    assert len(out["tokens"]) == 6 and out["kv_table"] == "bf16" and out["finish_reason"] == "length"
    assert out["kv_bytes_per_token"] == 2 * 2 * 2 * 128


def test_generate_streams_text_and_stats(model_dir, prompt):
    r = runner.invoke(app, ["generate", str(prompt), "--model", str(model_dir), "-n", "6", "--kv-table", "nvfp4",
                            "--device", "cpu"])
    assert r.exit_code == 0, r.stderr
    j = _json(runner.invoke(app, ["generate", str(prompt), "--model", str(model_dir), "-n", "6", "--kv-table",
                                  "nvfp4", "--device", "cpu", "--json"]))
    assert r.stdout == j["text"] + "\n"
    assert "prompt tokens" in r.stderr and "tok/s" in r.stderr and "nvfp4" in r.stderr


def test_generate_stdin_sampling_seed_and_stop(model_dir, prompt):
    args = ["generate", "-", "--model", str(model_dir), "-n", "8", "--json", "--temperature", "0.9", "--top-k",
            "40", "--top-p", "0.95", "--seed", "3", "--device", "cpu"]
    a = _json(runner.invoke(app, args, input=GOLDEN_PROMPT_TEXT))
    b = _json(runner.invoke(app, args, input=GOLDEN_PROMPT_TEXT))
    assert a["tokens"] == b["tokens"]
    full = _json(runner.invoke(app, ["generate", str(prompt), "-m", str(model_dir), "-n", "8", "--json"]))
    stop = full["text"][2:4]
    cut = _json(runner.invoke(app, ["generate", str(prompt), "-m", str(model_dir), "-n", "8", "--json",
                                    "--stop", stop, "--stop", "never-seen"]))
    assert cut["finish_reason"] == "stop" and cut["text"] == full["text"].split(stop)[0]


def test_generate_kv_table_file(model_dir, prompt, tmp_path):
    t = tmp_path / "table.json"
    t.write_text(json.dumps({"default": "nvfp4", "layers": {"0": "bf16"}}))
    out = _json(runner.invoke(app, ["generate", str(prompt), "-m", str(model_dir), "-n", "3", "--json",
                                    "--kv-table", str(t)]))
    assert out["kv_table_layers"] == [{"k": "bf16", "v": "bf16"}, {"k": "nvfp4", "v": "iso3"}]


def _error(args, match, input=None):
    r = runner.invoke(app, args, input=input)
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_generate_errors(model_dir, prompt, tmp_path, monkeypatch):
    # --device auto prints a note when a GPU is present; errors must be the only line either way
    monkeypatch.setattr("coldkv.runtime.backend.cuda_present", lambda: False)
    m = ["--model", str(model_dir)]
    _error(["generate", str(tmp_path / "none.txt"), *m], "does not exist")
    _error(["generate", str(tmp_path), *m], "is a directory")
    _error(["generate", str(prompt), "--model", str(tmp_path / "nomodel")], "does not exist")
    _error(["generate", str(prompt), *m, "--kv-table", "fp8"], "unknown KV table")
    _error(["generate", str(prompt), *m, "--device", "cuda"], "no usable CUDA GPU")
    _error(["generate", str(prompt), *m, "--device", "tpu"], "unknown device")
    _error(["generate", "-", *m], "empty", input="")
    _error(["generate", "-", *m], "not UTF-8", input=b"\xff\xfe bad bytes")
    _error(["generate", "-", *m], "context is 2048 tokens", input="The quick brown fox " * 1000)
    monkeypatch.setattr(coldkv, "DEFAULT_MODEL", tmp_path / "absent")
    _error(["generate", str(prompt)], "--model")
    r = runner.invoke(app, ["generate", str(prompt), *m, "--top-p", "0"])
    assert r.exit_code == 2


def test_generate_prefill_chunk_sizes_the_cuda_passes(model_dir, prompt, monkeypatch):
    """--prefill-chunk reaches the CUDA backend, which sizes its pass buffers for it (rounded up to
    whole 1024-token rows) instead of cutting a longer step to its default; its PlanError (buffers
    past the free GPU memory) is an error line."""
    from coldkv.errors import PlanError
    from coldkv.runtime import cuda_backend

    asked = []

    def backend(model_dir, page_tokens, prefill_chunk):
        asked.append(prefill_chunk)
        raise PlanError("use a smaller --prefill-chunk")

    monkeypatch.setattr("coldkv.runtime.backend.select_device", lambda device: ("cuda", None))
    monkeypatch.setattr(cuda_backend, "CUDABackend", backend)
    for chunk in ("3000", "16384"):
        _error(["generate", str(prompt), "--model", str(model_dir), "--prefill-chunk", chunk], "--prefill-chunk")
    _error(["generate", str(prompt), "--model", str(model_dir)], "--prefill-chunk")
    assert asked == [3072, 16384, None]


def test_generate_broken_checkpoints(tmp_path, prompt):
    d = make_checkpoint(tmp_path / "trunc", "llama")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:-64])
    _error(["generate", str(prompt), "-m", str(d)], "truncated")
    d = make_checkpoint(tmp_path / "cfg", "llama")
    (d / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    _error(["generate", str(prompt), "-m", str(d)], "unsupported architecture GPT2LMHeadModel")
    (d / "config.json").write_text("{")
    _error(["generate", str(prompt), "-m", str(d)], "not valid JSON")
    d = make_checkpoint(tmp_path / "tok", "llama")
    (d / "tokenizer.json").unlink()
    _error(["generate", str(prompt), "-m", str(d)], "tokenizer.json")


def test_info(model_dir):
    r = runner.invoke(app, ["info", "--model", str(model_dir)])
    assert r.exit_code == 0, r.stderr
    for word in ("device", "qwen3", "bf16", "int8", "nvfp4", "default", "bytes/token"):
        assert word in r.stdout
    out = _json(runner.invoke(app, ["info", "--model", str(model_dir), "--json"]))
    assert out["model"]["layers"] == 2 and out["kv_tables"]["bf16"]["bytes_per_token"] == 1024
    assert out["kv_tables"]["nvfp4"]["bytes_per_token"] == 2 * 2 * 2 * 36
    assert os.path.isabs(out["kernel_cache"]["path"]) and out["kernel_cache"]["files"] >= 0
    _error(["info", "--model", str(model_dir.parent / "nope")], "does not exist")


def test_generate_threads_option(model_dir, prompt):
    from coldkv.runtime.blas import get_threads

    before = get_threads()
    out = _json(runner.invoke(app, ["generate", str(prompt), "-m", str(model_dir), "-n", "3", "--json",
                                    "--threads", "2"]))
    assert len(out["tokens"]) == 3 and get_threads() == before  # restored after the run


def test_generate_says_when_it_compiles(model_dir, prompt, tmp_path):
    """A fresh kernel cache: the first run says it compiles (it waits seconds for it) and that its
    rates count the compiles, the next loads the kernels and says nothing."""
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "kernels")}
    cmd = [sys.executable, "-m", "coldkv", "generate", str(prompt), "--model", str(model_dir), "-n", "2",
           "--device", "cpu"]
    runs = [subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    assert "compiling CPU kernels" in runs[0].stderr
    assert "rates count that time" in runs[0].stderr
    assert "compil" not in runs[1].stderr and runs[1].stdout == runs[0].stdout
    warm = subprocess.run(cmd + ["--json"], env=env, capture_output=True, text=True, timeout=600)
    assert json.loads(warm.stdout)["compiled_kernels"] is False
