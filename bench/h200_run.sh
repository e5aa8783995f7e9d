#!/usr/bin/env bash
# One device call: the whole gpu suite, then the decode grid, the codecs and generate benchmarks
# on a quiet GPU (each bench compiles while the tests run, then waits for them). Writes under $OUT.
# Usage (device `run`, carry [".whl"]):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; bash bench/h200_run.sh <commit>
# H200 at 6390c47 / a1a8206: tests ~235-260 s, decode grid ~60 s after them, codecs ~60 s, generate
# (4k/32k/128k) ~120 s: ~450-550 s in all, so keep it the only thing in the call.
# A second argument "nocodecs" skips the codecs benchmark (~60 s) when its kernels did not change.
set -u
C=${1:?commit}
S=$(date +%s)
timeout 330 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/ > "$OUT/gpu_pytest_$C.log" 2>&1 &
T=$!
timeout 420 python3 bench/attention_decode.py --commit "$C" --wait-pid $T --out "$OUT/attention_decode.json" > "$OUT/decode.log" 2>&1 &
D=$!
if [ "${2:-}" != nocodecs ]; then
  timeout 480 python3 bench/codecs.py --commit "$C" --wait-pid $D --out "$OUT/codecs.json" > "$OUT/codecs.log" 2>&1
fi
wait
left=$(( 570 - ($(date +%s) - S) ))
[ $left -gt 60 ] && timeout $left python3 bench/generate.py --commit "$C" --repeats 2 --out "$OUT/generate.json" > "$OUT/generate.log" 2>&1
echo "elapsed $(( $(date +%s) - S )) s"
tail -n 3 "$OUT/gpu_pytest_$C.log"
grep -h '^{"format' "$OUT/decode.log" | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    print(r['format'], r['context'], f\"{r['q_heads']}/{r['kv_heads']}/{r['head_dim']}\", 'valid', r.get('graph_valid'),
          f\"{r.get('coldkv_graph_us', 0):.1f} us\", f\"sdpa {r['sdpa_bf16_us']:.1f}\", f\"x{r.get('speedup_graph', 0):.2f}\")"
grep -E "x copy" "$OUT/codecs.log" 2>/dev/null | head -20
grep '^{' "$OUT/generate.log" 2>/dev/null | cut -c1-300
