#!/usr/bin/env bash
# One device call: train coldkv-tiny, held-out loss, needle eval; results under $OUT (or runs/dev).
#   MINUTES=5.25 EVAL_LIMIT=150 bash tools/h200_train_eval.sh
# $OUT gets: log, model-0000x-of-0000y.safetensors (<= 15 MB each) and meta.tar (config.json,
# generation_config.json, model.safetensors.index.json, tokenizer_config.json, train_log.json,
# model_needle.json) -- the device tool returns at most 8 files.
set -uo pipefail
OUT=${OUT:-runs/dev}
WORK=${WORK:-/tmp/coldkv-train}
mkdir -p "$OUT" "$WORK"
{
  nvidia-smi --query-gpu=name,memory.total --format=csv 2>/dev/null
  python3 -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"
  python3 tools/train_model.py --data data/tok --out "$WORK/model" --minutes "${MINUTES:-5.25}" ${TRAIN_ARGS:-} \
    && python3 tools/needle_eval.py --model "$WORK/model" --haystack data/tok/heldout.npy \
         --out "$WORK/model/model_needle.json" --time-limit "${EVAL_LIMIT:-150}" ${EVAL_ARGS:-}
  echo "exit: $?"
} 2>&1 | grep --line-buffered -v -E 'Loading weights|Writing model shards|FutureWarning|warnings.warn|return forward_call|deprecated' | tee "$OUT/log"
cp "$WORK"/model/*.safetensors "$OUT"/ 2>/dev/null
(cd "$WORK/model" && tar cf - --ignore-failed-read *.json) > "$OUT/meta.tar"
ls -la "$OUT"
