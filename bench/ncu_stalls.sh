#!/usr/bin/env bash
# Usage (device): bash bench/ncu_stalls.sh nvfp4 bf16@p int8   (formats/variants of bench/attention_decode.py)
#                 bash bench/ncu_stalls.sh --prefill [--path wg8w3] bf16 nvfp4  (bench/ncu_prefill.py: "fa" or
#                   --path's kernel, T 2048, 32768 keys, 4/2/128)
#                 bash bench/ncu_stalls.sh --codecs nvfp4 int8     (bench/ncu_codecs.py: requant to c4g64, 32768 pages)
#                 bash bench/ncu_stalls.sh --layers rms_norm qkv_rope_append:nvfp4 swiglu  (bench/ncu_layers.py: the
#                   per-token kernels at one 8192-token chunk of the bundled model)
# ncu stall reasons + pipe use of the decode attention kernel (131072 tokens, 32/8/128), or of the prefill one
# (sm__cycles_active min / avg / max against sm__cycles_elapsed: how long the SMs sat idle at the
# kernel's start and tail, the decode step's fixed cost of kernels.md Decode 1)
M=""
for r in long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle not_selected selected barrier dispatch_stall no_instruction tex_throttle drain branch_resolving imc_miss math; do
  M="$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
M="${M:1},sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,smsp__inst_executed.sum,smsp__warps_launched.sum,launch__registers_per_thread,launch__occupancy_limit_registers,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_op_ldsm.sum,sm__cycles_elapsed.avg,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max"
SCRIPT=bench/ncu_decode.py; K=attn_mma
EXTRA=""
if [ "${1:-}" = --prefill ]; then SCRIPT=bench/ncu_prefill.py; K="attn_mma_fa|attn_ws"; shift; fi
if [ "${1:-}" = --path ]; then EXTRA="--path $2"; shift 2; fi
if [ "${1:-}" = --codecs ]; then SCRIPT=bench/ncu_codecs.py; K=requant; shift; fi
if [ "${1:-}" = --layers ]; then SCRIPT=bench/ncu_layers.py; K="rms_norm|qkv_rope_append|swiglu|kv_amax"; shift; fi
for f in "$@"; do
  timeout 120 ncu --clock-control none --kernel-name-base function -k regex:"$K" -s 1 -c 1 --metrics $M python3 $SCRIPT $f $EXTRA 2>&1 | grep -E "^\s+(smsp|sm__|dram|l1tex|lts|gpu__|launch)" | sed "s/^/$f /"
done
