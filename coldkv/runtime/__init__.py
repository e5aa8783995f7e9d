"""Model runtime: load a Hugging Face checkpoint, run it over the paged, quantized KV cache.

    from coldkv.runtime.loader import resolve_model
    from coldkv.runtime.backend import load_backend
    from coldkv.runtime.tokenizer import Tokenizer
    from coldkv.runtime.kv_table import resolve_table
    from coldkv.runtime.engine import generate

    model_dir = resolve_model("Qwen/Qwen3-0.6B")           # or a directory, or None: the bundled model
    backend, note = load_backend(model_dir, "cpu")
    tok = Tokenizer.from_dir(model_dir)
    table = resolve_table("nvfp4", backend.args.num_hidden_layers, model_dir)
    result = generate(backend, tok, tok.encode("Once upon a time"), table=table, max_new_tokens=32)

    cache = backend.new_cache(table, max_tokens=4096)      # lower level: logits for every position
    logits = backend.forward(ids, cache, all_logits=True)  # [T, vocab] float32; cache.dense(layer) for K/V

Modules: config (ModelArgs), loader, safetensors_io, tokenizer, rope, model (CPU forward), kv_table,
kv_cache (PagedKVCache), backend (Backend protocol, CPUBackend, device choice), sampling, engine
(generate loop), blas (OpenBLAS threads), commands (what the CLI commands do). docs/runtime.md.
"""
