#!/usr/bin/env bash
# One device call: the gpu suite and the benchmarks, each bench compiling while the tests run and
# timing only after them (a quiet GPU). Usage (device `run`, carry [".whl"], + "bench/variants" for
# the layers A/B):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; bash bench/h200_run.sh <commit> [parts] [seconds]
# parts, comma-separated (default tests,decode,codecs,generate):
#   tests     the whole gpu suite, -n 12 (~290-430 s at -n 8 until session 35; at ca58163, 200 tests, -n 8
#             reached 73% in 470 s, so 12 workers on the device's 16 cores and a timeout of 520; run it
#             alone in a call; at 2ffeb58, 205 tests, -n 12 on an H100 reached 71% in 520 s: use
#             tests1 and tests2; at 04c6c70, 203 tests, with the kernel cache's compile claims, it
#             reached 70% in 520 s on an H100: still two calls)
#   tests1 / tests2  the gpu suite in two calls: the attention kernels' tests / the rest (if the whole
#             suite still runs past 520 s)
#   backend   only the CUDA backend's, the sampling kernel's and the kernel cache's gpu tests (when only
#             the runtime changed)
#   decode    bench/attention_decode.py, the decode grid (~60 s after the tests; ~90 s since session 41 added
#             four int8 variants at the three variant contexts)
#   codecs    bench/codecs.py --rounds 3 (1 round ~60 s)
#   rqab      requant from bf16 / int8, today's kernels against each carried bench/variants/requant_*.py,
#             5 rounds (~90 s; make one with `git show C:coldkv/numba_kernels/requant.py > bench/variants/requant_C.py`)
#   prefill   bench/attention_prefill.py at T 2048 (fa, wg8, wg8a, wg8w, wg8w3; ~60 s)
#   mixed     prefill with K and V in other formats (int8/nvfp4, bf16/nvfp4, as a --kv-table JSON may
#             give a layer): wg8a, auto's for them, against the warp-specialized kernels at T 2048;
#             then generate at 32k, int8 KV, auto (wg8wpp) against wg8w (~4 min; the pingpong part
#             that measured wg8w3pp / wg8wpp in session 45 is at 7091995)
#   ringab    the warp-specialized prefill kernels (wg8w3, wg8wpp; nvfp4, bf16, int8 at T 2048, 32768 keys)
#             with today's attention_prefill.py, then with each carried bench/variants/attention_prefill_*.py
#             copied over it, a process each (~1.5 min each; session 47: noq, the dead 32 KB of Q shared
#             memory dropped, and s5, that and a 5-buffer ring without pingpong)
#   generate  bench/generate.py, 4k/32k/128k vs HF and the decode launch A/B (~120 s)
#   startup   bench/startup.py, a fresh `coldkv generate --device cuda` with an empty / warm kernel
#             cache vs a fresh HF process (~60 s)
#   profile   bench/prefill_profile.py, 32k nvfp4 and 64 decode steps, and HF's prefill beside it, each
#             split into attention and the rest (~40 s)
#   hostprofile  bench/prefill_profile.py --host --decode 256 at a 4096-token prompt: the pipelined
#             decode step's wall time against its GPU time, and its host functions by own time a
#             step (session 42; on the H200's slower host the step is host-bound; ~40 s)
#   chunks    the prefill chunk: generate at 32k, nvfp4 and int8, 8192-token passes (the bundled model's
#             default) against 16384 and 32768, and a profile at 32768 (~120 s)
#   layers    bench/layers.py (against bench/variants/layers_*.py when carried; <= 120 s)
#   breakdown bench/decode_breakdown.py, a decode step's fixed cost: the step, the attention kernel alone
#             and the split merge alone (nvfp4, int8, bf16 at 4096 / 32768 / 131072; ~40 s)
#   wgmma     bench/wgmma_probe.py (a process per case, ~1-2 min)
#   ncu_decode  ncu of the decode attention kernel, int8 and nvfp4 at 131072 tokens, 32/8/128: stalls, pipes,
#             and the SMs' active cycles min / avg / max against the elapsed ones (is the step's fixed
#             cost idle SMs at the start and tail? kernels.md Decode 1; ~1 min)
#   ncu_layers  ncu stall reasons and pipe use of rms_norm, qkv_rope_append (nvfp4 pages and the calibration
#             pass) and swiglu at one 8192-token chunk (bench/ncu_stalls.sh --layers; ~2 min)
# The benches compile their kernels in worker processes first (--jobs: 8, or 3 beside the suite;
# session 37's two prefill benches spent 183 and 128 s of a 430 s call compiling one kernel after
# another), then load them from the shared disk cache.
# seconds: what the script may take (default 540). Every part's timeout is the time left, and the
# results are copied to $OUT after each part, so a call cut short by the device's 600 s limit still
# returns what finished (at deca753 a fixed 535 s prefill timeout after 3 codec rounds ran past it
# and the call returned nothing). The device returns at most 8 files: the JSONs, the pytest log and
# one tarball of all logs.
set -u
C=${1:?commit}
PARTS=",${2:-tests,decode,codecs,generate},"
B=${3:-540}
S=$(date +%s)
FINAL_OUT=$OUT
OUT=$(mktemp -d)
has() { [[ $PARTS == *,$1,* ]]; }
left() { echo $(( B - ($(date +%s) - S) )); }
save() {
  cp "$OUT"/*.json "$OUT"/gpu_pytest_*.log "$FINAL_OUT"/ 2>/dev/null
  tar czf "$FINAL_OUT/logs_$C.tgz" -C "$OUT" . 2>/dev/null
}
# each line of a log prefixed with the seconds since the script started: a run cut by its timeout
# never prints pytest's --durations, and the -v lines carry no times (session 46's cut run)
stamp() { local t l; while IFS= read -r l; do printf -v t '%(%s)T' -1; printf '%4ds %s\n' $(( t - S )) "$l"; done; }
W=0  # the process the next bench waits for before timing
TESTS=""
has backend && TESTS="tests/test_cuda_backend.py tests/test_sampling_cuda.py tests/test_jit_cache.py"
has tests1 && TESTS=tests/test_attention_cuda.py
has tests2 && TESTS=$(ls tests/test_*.py | grep -v test_attention_cuda.py | tr '\n' ' ')
has tests && TESTS=tests/
# compile workers a bench starts (benchutil.compile_in_workers): fewer while the suite's 12 run
J=$([ -n "$TESTS" ] && echo 3 || echo 8)
if [ -n "$TESTS" ]; then
  (timeout $(( $(left) < 520 ? $(left) : 520 )) python3 -m pytest -m gpu -n 12 -v --durations=30 -p no:cacheprovider \
    $TESTS 2>&1 | stamp > "$OUT/gpu_pytest_$C.log") &  # -v: a timeout cutting a -q run loses the failing names
  W=$!
fi
if has decode; then
  timeout $(left) python3 bench/attention_decode.py --commit "$C" --jobs $J --wait-pid $W --variant-contexts 32768 131072 360000 --out "$OUT/attention_decode.json" \
    > "$OUT/decode.log" 2>&1 &
  W=$!
fi
if has codecs; then
  timeout $(left) python3 bench/codecs.py --commit "$C" --rounds 3 --wait-pid $W --out "$OUT/codecs.json" \
    > "$OUT/codecs.log" 2>&1
  save
fi
if has rqab; then
  VS=$(for f in bench/variants/requant_*.py; do [ -e "$f" ] && b=$(basename "$f" .py) && \
       printf 'v%s=coldkv.numba_kernels.quant+variants.%s,' "${b#requant_}" "$b"; done)
  timeout $(left) python3 bench/codecs.py --commit "$C" --ops requant --formats bf16,int8 --rounds 5 --wait-pid $W \
    ${VS:+--variants ${VS%,}} --out "$OUT/codecs_requant_ab.json" > "$OUT/codecs_ab.log" 2>&1
  save
fi
if has prefill; then
  timeout $(left) python3 bench/attention_prefill.py --commit "$C" --jobs $J --wait-pid $W --T 2048 --contexts 32768 \
    --shapes 4/2/128 32/8/128 --paths fa wg8 wg8a wg8w wg8w3 --formats bf16 nvfp4 --repeats 5 \
    --out "$OUT/attention_prefill_T2048.json" > "$OUT/prefill.log" 2>&1
  save
fi
if has ringab; then  # a variant replaces the module in this copy of the tree, restored after
  AP=coldkv/numba_kernels/attention_prefill.py
  cp $AP /tmp/attention_prefill_today.py
  for v in today bench/variants/attention_prefill_*.py; do
    [ -e "$v" ] || [ $v = today ] || continue
    n=$(basename $v .py); n=${n#attention_prefill_}
    [ $v = today ] || cp $v $AP
    [ $(left) -gt 60 ] && timeout $(left) python3 bench/attention_prefill.py --commit "$C" --jobs $J --wait-pid $W \
      --T 2048 --contexts 32768 --shapes 4/2/128 32/8/128 --paths wg8w3 wg8wpp --formats nvfp4 bf16 int8 \
      --repeats 5 --out "$OUT/prefill_ring_$n.json" > "$OUT/prefill_ring_$n.log" 2>&1
    save
  done
  cp /tmp/attention_prefill_today.py $AP
fi
if has mixed; then
  timeout $(left) python3 bench/attention_prefill.py --commit "$C" --jobs $J --wait-pid $W --T 2048 --contexts 32768 \
    --shapes 4/2/128 32/8/128 --paths wg8a wg8w wg8w3 wg8wpp --formats int8/nvfp4 bf16/nvfp4 --repeats 5 \
    --out "$OUT/attention_prefill_mixed.json" > "$OUT/prefill_mixed.log" 2>&1
  save
  [ $(left) -gt 90 ] && timeout $(left) python3 bench/generate.py --commit "$C" --jobs $J --prompts 32768 \
    --tables int8 --prefill-attention auto,wg8w --repeats 5 --no-launch-ab \
    --out "$OUT/generate_32k_int8.json" > "$OUT/generate_int8.log" 2>&1
  save
fi
wait
save
has generate && [ $(left) -gt 60 ] && timeout $(left) python3 bench/generate.py --commit "$C" --jobs $J \
  --repeats $([ $(left) -gt 150 ] && echo 2 || echo 1) --out "$OUT/generate.json" > "$OUT/generate.log" 2>&1
save
has startup && [ $(left) -gt 90 ] && timeout $(left) python3 bench/startup.py --commit "$C" \
  --out "$OUT/startup.json" > "$OUT/startup.log" 2>&1
save
has profile && [ $(left) -gt 45 ] && timeout $(left) python3 bench/prefill_profile.py --commit "$C" \
  --table nvfp4 --decode 64 --hf --out "$OUT/prefill_profile.json" > "$OUT/prefill_profile.log" 2>&1
save
has hostprofile && [ $(left) -gt 45 ] && timeout $(left) python3 bench/prefill_profile.py --commit "$C" \
  --prompt 4096 --table nvfp4 --decode 256 --host --out "$OUT/decode_host_profile.json" > "$OUT/decode_host_profile.log" 2>&1
save
has chunks && [ $(left) -gt 60 ] && timeout $(left) python3 bench/generate.py --commit "$C" --jobs $J --prompts 32768 \
  --tables nvfp4,int8 --prefill-attention auto,auto@16384,auto@32768 --repeats 3 --no-launch-ab \
  --out "$OUT/generate_32k_chunks.json" > "$OUT/generate_chunks.log" 2>&1
save
has chunks && [ $(left) -gt 45 ] && timeout $(left) python3 bench/prefill_profile.py --commit "$C" \
  --table nvfp4 --chunk 32768 --out "$OUT/prefill_profile_chunk32768.json" > "$OUT/prefill_profile_chunk.log" 2>&1
save
V=$(ls bench/variants/layers_*.py 2>/dev/null | head -1)
has layers && [ $(left) -gt 60 ] && timeout $(( $(left) < 120 ? $(left) : 120 )) python3 bench/layers.py --commit "$C" \
  ${V:+--variants old=variants.$(basename "$V" .py)} --out "$OUT/layers.json" > "$OUT/layers.log" 2>&1
save
has breakdown && [ $(left) -gt 60 ] && timeout $(( $(left) < 150 ? $(left) : 150 )) python3 bench/decode_breakdown.py \
  --commit "$C" --formats nvfp4 int8 bf16 --contexts 4096 32768 131072 \
  --out "$OUT/decode_breakdown.json" > "$OUT/breakdown.log" 2>&1
save
has wgmma && [ $(left) -gt 30 ] && timeout $(( $(left) < 150 ? $(left) : 150 )) python3 bench/wgmma_probe.py \
  --commit "$C" --out "$OUT/wgmma_probe.json" > "$OUT/wgmma.log" 2>&1
save
has ncu_decode && [ $(left) -gt 60 ] && timeout $(left) bash bench/ncu_stalls.sh int8 nvfp4 > "$OUT/ncu_decode.txt" 2>&1
save
has ncu_layers && [ $(left) -gt 60 ] && timeout $(left) bash bench/ncu_stalls.sh --layers rms_norm \
  qkv_rope_append:nvfp4 qkv_calib swiglu > "$OUT/ncu_layers.txt" 2>&1
save
echo "elapsed $(( $(date +%s) - S )) s"
tail -n 3 "$OUT/gpu_pytest_$C.log" 2>/dev/null
grep -E "FAILED|ERROR" "$OUT/gpu_pytest_$C.log" 2>/dev/null | head
python3 -c "import json; d = json.load(open('$OUT/wgmma_probe.json')); print('wgmma', d['checks'], d.get('loop'))" 2>/dev/null
grep -h '^{"format' "$OUT/decode.log" 2>/dev/null | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    print(r['format'], r['context'], f\"{r['q_heads']}/{r['kv_heads']}/{r['head_dim']}\", 'valid', r.get('graph_valid'),
          f\"{r.get('coldkv_us', 0):.1f} us\", f\"sdpa {r['sdpa_bf16_us']:.1f}\", f\"x{r.get('speedup', 0):.2f}\")"
grep -E "x copy" "$OUT/codecs.log" 2>/dev/null | head -30
grep '^{' "$OUT/generate.log" 2>/dev/null | cut -c1-300
grep '^{' "$OUT/startup.log" 2>/dev/null
grep -h " us valid" "$OUT/prefill.log" 2>/dev/null
grep -h " us valid" "$OUT/prefill_mixed.log" 2>/dev/null
grep -H " us valid" "$OUT"/prefill_ring_*.log 2>/dev/null | sed "s|^.*/prefill_ring_||"
grep '^{' "$OUT/generate_int8.log" 2>/dev/null | cut -c1-300
python3 -c "import json; d = json.load(open('$OUT/prefill_profile.json')); print({k: d[k] for k in ('wall_ms', 'gpu_busy_ms', 'attention_ms', 'other_ms')}); print('hf', {k: d['hf'][k] for k in ('wall_ms', 'gpu_busy_ms', 'attention_ms', 'other_ms')} if 'hf' in d else None); print('gpu idle', d.get('gpu_idle')); [print(round(t['ms'], 2), t['name'][:60]) for t in d['top'][:6]]" 2>/dev/null
python3 -c "import json; d = json.load(open('$OUT/decode_host_profile.json'))['decode']; print({k: v for k, v in d.items() if not isinstance(v, list)}); [print(r) for r in d['host_top_own_per_step'][:8]]" 2>/dev/null
grep -E " us .*x copy" "$OUT/layers.log" 2>/dev/null
grep -E '^(floor|\{)' "$OUT/breakdown.log" 2>/dev/null | cut -c1-240
save
