#!/usr/bin/env bash
# One device call: the whole gpu suite, then the decode grid, the codecs and generate benchmarks
# on a quiet GPU (each bench compiles while the tests run, then waits for them). Writes under $OUT.
# Usage (device `run`, carry [".whl"]):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; bash bench/h200_run.sh <commit>
# H200 at 6390c47 / a1a8206: tests ~235-260 s (7e81a48: > 330 s, 123 of 124 done), decode grid ~60 s after them, codecs ~60 s, generate
# (4k/32k/128k) ~120 s: ~450-550 s in all, so keep it the only thing in the call.
# A second argument "nocodecs" skips the codecs benchmark (~60 s) when its kernels did not change; a
# third, "prefill", adds bench/attention_prefill.py at T 2048 (fa, wg8, wg8a, wg8s; ~60 s), bench/prefill_profile.py
# (32k, nvfp4, and 64 decode steps) and bench/layers.py (against bench/variants/layers_*.py when carried); a
# fourth is the seconds the whole script may take (default 570). bench/wgmma_probe.py (~1-2 min: a process per case) runs
# last, in the time left.
set -u
C=${1:?commit}
# The device returns at most 8 files: everything is written to a temporary folder, then the JSONs and
# the pytest log are copied to $OUT with the rest in one tarball.
FINAL_OUT=$OUT
OUT=$(mktemp -d)
B=${4:-570}  # seconds this script may take (generate and the profile only start if time is left)
S=$(date +%s)
timeout 420 python3 -m pytest -m gpu -n 8 -v -p no:cacheprovider tests/ > "$OUT/gpu_pytest_$C.log" 2>&1 &  # ~310-380 s; 380 cut the summary at e5ff7cf
T=$!
timeout 480 python3 bench/attention_decode.py --commit "$C" --wait-pid $T --out "$OUT/attention_decode.json" > "$OUT/decode.log" 2>&1 &
D=$!
if [ "${2:-}" != nocodecs ]; then
  timeout 480 python3 bench/codecs.py --commit "$C" --rounds 3 --wait-pid $D --out "$OUT/codecs.json" > "$OUT/codecs.log" 2>&1
fi
if [ "${3:-}" = prefill ]; then  # the prefill kernel at T 2048 vs SDPA, compiled while the tests run
  # it waits for the tests and the decode grid (~350 s at d7dd710), so its timeout is the budget's
  timeout $(( B - 30 )) python3 bench/attention_prefill.py --commit "$C" --wait-pid $D --T 2048 --contexts 32768 \
    --shapes 4/2/128 32/8/128 --paths fa wg8 wg8a wg8s --formats bf16 nvfp4 --repeats 5 \
    --out "$OUT/attention_prefill_T2048.json" > "$OUT/prefill.log" 2>&1
fi
wait
left=$(( B - ($(date +%s) - S) ))
[ $left -gt 60 ] && timeout $left python3 bench/generate.py --commit "$C" --repeats $([ $left -gt 150 ] && echo 2 || echo 1) \
  --out "$OUT/generate.json" > "$OUT/generate.log" 2>&1
left=$(( B - ($(date +%s) - S) ))
[ "${3:-}" = prefill ] && [ $left -gt 45 ] && timeout $left python3 bench/prefill_profile.py --commit "$C" \
  --table nvfp4 --decode 64 --out "$OUT/prefill_profile.json" > "$OUT/prefill_profile.log" 2>&1
left=$(( B - ($(date +%s) - S) ))  # the per-token kernels against a copy of their bytes (and session 16's, if carried)
V=$(ls bench/variants/layers_*.py 2>/dev/null | head -1)
[ "${3:-}" = prefill ] && [ $left -gt 60 ] && timeout $(( left < 120 ? left : 120 )) python3 bench/layers.py --commit "$C" \
  ${V:+--variants old=variants.$(basename "$V" .py)} --out "$OUT/layers.json" > "$OUT/layers.log" 2>&1
left=$(( B - ($(date +%s) - S) ))  # last: a diagnostic, one process per case (~1-2 min)
[ $left -gt 30 ] && timeout $(( left < 150 ? left : 150 )) python3 bench/wgmma_probe.py --commit "$C" \
  --out "$OUT/wgmma_probe.json" > "$OUT/wgmma.log" 2>&1
echo "elapsed $(( $(date +%s) - S )) s"
tail -n 3 "$OUT/gpu_pytest_$C.log"
grep -E "FAILED|ERROR" "$OUT/gpu_pytest_$C.log" | head
python3 -c "import json; d = json.load(open('$OUT/wgmma_probe.json')); print('wgmma', d['checks'], d.get('loop'))" 2>/dev/null || tail -3 "$OUT/wgmma.log"
grep -h '^{"format' "$OUT/decode.log" | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    print(r['format'], r['context'], f\"{r['q_heads']}/{r['kv_heads']}/{r['head_dim']}\", 'valid', r.get('graph_valid'),
          f\"{r.get('coldkv_graph_us', 0):.1f} us\", f\"sdpa {r['sdpa_bf16_us']:.1f}\", f\"x{r.get('speedup_graph', 0):.2f}\")"
grep -E "x copy" "$OUT/codecs.log" 2>/dev/null | head -20
grep '^{' "$OUT/generate.log" 2>/dev/null | cut -c1-300
grep -h " us valid" "$OUT/prefill.log" 2>/dev/null
python3 -c "import json; d = json.load(open('$OUT/prefill_profile.json')); print({k: d[k] for k in ('wall_ms', 'gpu_busy_ms')}); [print(round(t['ms'], 2), t['name'][:60]) for t in d['top'][:6]]" 2>/dev/null
grep -E " us .*x copy" "$OUT/layers.log" 2>/dev/null
cp "$OUT"/*.json "$OUT/gpu_pytest_$C.log" "$FINAL_OUT"/ 2>/dev/null
tar czf "$FINAL_OUT/logs_$C.tgz" -C "$OUT" .
