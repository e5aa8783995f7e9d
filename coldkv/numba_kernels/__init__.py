# The modules that define CUDA kernels, each listing its builds in PTX_SIGNATURES (and the benchmark
# variants in PTX_SIGNATURES_MORE): tests/test_ptx.py compiles them, tests/test_jit_cache.py
# fingerprints them. A new kernel module goes here.
KERNEL_MODULES = ("quant", "requant", "attention_cuda", "attention_mma", "attention_prefill", "rans", "layers",
                  "sampling")
