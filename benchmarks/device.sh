#!/usr/bin/env bash
# The one entry point for a run on the lent GPU machine, from the repository root:
#     GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh WHAT [WHAT ...]
#     bash benchmarks/device.sh                # lists what it can run, one line each
# Sets the common environment once (benchmarks/device_env.sh: unbuffered Python, $OUT, the carried wheels of
# .whl installed into /tmp/site, PYTHONPATH=/tmp/site:$PWD), then runs each WHAT's script in turn, in one
# call. Every name is checked before anything runs. BUDGET (seconds of the call left for a script that
# sizes its last step by it) starts at ${BUDGET:-570} and shrinks with the elapsed time. A script
# benchmarks/NAME_device.sh not in the table below runs as WHAT "NAME" with "_" written "-".
# Exit status: 2 for an unknown WHAT, else the first failing script's, else 0.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

# WHAT|script|its settings|carry|what it measures
RUNS=(
  "gpu-tests|gpu_tests_device.sh||.whl .whl_fi|ROSE's GPU tests and the parity report against transformers (FlashInfer's backends too)"
  "engine|engine_device.sh||.whl|GPU tests (fused kernels first), then benchmarks.rose_gpu: ROSE vs HF eager/compile, lever by lever, saturation"
  "qk-rope|qk_rope_device.sh||.whl .whl_fi|the QK-norm+RoPE kernel alone per block size, GPU tests, the 0.6B's breakdown, rose-graphs vs rose-best"
  "attention|attention_device.sh||.whl_fi|attention backends per token bucket, bidirectional with the JIT build timed, their GPU tests, then causal"
  "profile|best_device.sh|STEP=profile|.whl_fi|causal attention A/B of the Qwen3 shapes -> profiles, then GPU time per kernel class (rose_breakdown)"
  "best|best_device.sh|STEP=best|.whl_fi|rose-graphs vs rose-best (the measured attention profiles) for Qwen3-0.6B, Qwen3-4B and MiniLM"
  "triton-attention|triton_attention_device.sh||.whl|ROSE's Triton ragged attention beside torch's varlen: GPU tests, the A/B -> profiles (AB=1), masked vs unmasked key blocks (SPLIT=1), rose-graphs vs varlen, MPNet and the windowed models (FAMILIES=1) (~9 min)"
  "fa4-1|fa4_device.sh|STEP=1|.whl_fa4a|FlashAttention 4, first half of its wheels parked under /root (measures nothing; run fa4-2 next)"
  "fa4-2|fa4_device.sh|STEP=2|.whl_fa4b|FlashAttention 4 joined and installed, its GPU tests, the attention A/B with fa4 (FlashInfer too if installed)"
  "stack|stack_device.sh||.whl|the four suites through HTTP (ivy up) for Qwen3-0.6B and MiniLM, the in-process replay, the zero-cost-engine overhead"
  "batcher-ab|batcher_ab_device.sh||.whl|GPU tests, then Tulip's batch pacing and idle capture A/B through the stack on Qwen3-0.6B"
  "stack-layers|stack_layers_device.sh||.whl|GPU tests, then the stack's layers apart (ivy-text, ivy-ids, tulip-grpc, in-process) on Qwen3-0.6B, one run"
  "stack-ab|stack_layers_device.sh|STEP=ab|.whl|stack A/Bs on Qwen3-0.6B: stream vs unary gRPC, idle capture, Tulips per GPU"
  "stack-commits|stack_layers_device.sh|STEP=commits|.whl .base|the layers (texts, ids, Tulip) of an older commit's stack (.base, BASE_COMMIT) beside this tree's, alternating twice (~6 min)"
  "stack-framed|stack_layers_device.sh|STEP=framed|.whl|the framed EmbedStream (ivy up) beside the gRPC stream (--framed false) through the stack, the layers alternating twice (~6 min)"
  "lanes|lanes_device.sh||.whl|priority lanes on Qwen3-0.6B: 1 interactive client beside 4 bulk, idle / FCFS / lanes (express off) / express (~3 min)"
  "soak|soak_device.sh||.whl|soak at 70 % of saturation on Qwen3-0.6B: RSS, pinned bytes, p99 flat, 0 errors (one whole call ~9.5 min; STEP=start then STEP=finish: 10 min over two calls)"
  "index|index_device.sh||.whl|ivy index through ivy up vs the engine in-process on Qwen3-0.6B, SIGKILL + --resume (~4 min)"
  "green-contexts|green_contexts_device.sh|||CUDA green contexts: GEMMs and graphs confined to a green stream's SMs, a small GEMM chain beside bulk held to fewer SMs (~20 s)"
  "encoder-norms|encoder_norms_device.sh||.whl|the encoders' add + LayerNorm and embeddings kernels: the BERT families' GPU tests (TESTS=0: none), then the engine A/B (ROSE_ENCODER_NORMS 0/1) of MiniLM, MPNet and DistilBERT (~4 min)"
  "heads|heads_device.sh||.whl|the cross-encoders, SPLADE and BGE-M3 of issue 16 in benchmarks.rose_gpu beside HF (bs1-128, docs-100)"
  "remote-families|heads_device.sh|TAG=_remote MODELS=gte-base-en-v1.5,nomic-embed-text-v1.5 VARIANTS=rose-eager,rose-graphs|.whl|GTE v1.5 and NomicBERT in benchmarks.rose_gpu, ROSE rows only (no HF class offline; ~1-2 min)"
)

# A script's own one-line summary: the first comment after the shebang.
summary() { awk 'NR > 1 && /^#/ { sub(/^# */, ""); print; exit } NR > 1 { exit }' "benchmarks/$1" 2>/dev/null; }

# entry WHAT -> "WHAT|script|settings|carry|description" on stdout, or status 1.
entry() {
  local run
  for run in "${RUNS[@]}"; do
    [ "${run%%|*}" = "$1" ] && { echo "$run"; return 0; }
  done
  case "$1" in *[!a-z0-9-]*|"") return 1 ;; esac
  local script="${1//-/_}_device.sh"
  [ -f "benchmarks/$script" ] && { echo "$1|$script|||"; return 0; }
  return 1
}

list() {
  echo "usage: bash benchmarks/device.sh WHAT [WHAT ...]   (several run in turn, in one call)"
  local run what script settings carry desc known=" "
  for run in "${RUNS[@]}"; do
    IFS='|' read -r what script settings carry desc <<< "$run"
    known+="$script "
    [ -n "$desc" ] || desc=$(summary "$script")
    [ -f "benchmarks/$script" ] || desc="(benchmarks/$script is not in this tree)"
    printf '  %-12s carry %-13s %s\n' "$what" "$carry" "$desc"
  done
  for script in benchmarks/*_device.sh; do
    script=${script#benchmarks/}
    case "$known" in *" $script "*) continue ;; esac
    what=${script%_device.sh}
    printf '  %-12s carry %-13s %s\n' "${what//_/-}" "(its header)" "$(summary "$script")"
  done
}

if [ $# -eq 0 ]; then list; exit 0; fi
for what in "$@"; do
  run=$(entry "$what") || { echo "device.sh: no run named '$what'" >&2; list >&2; exit 2; }
  IFS='|' read -r _ script _ <<< "$run"
  [ -f "benchmarks/$script" ] || { echo "device.sh: $what needs benchmarks/$script, not in this tree" >&2; exit 2; }
done

source benchmarks/device_env.sh || { echo "device.sh: the common environment failed (benchmarks/device_env.sh)" >&2; exit 1; }
total=${BUDGET:-570}
t0=$(date +%s)
status=0
for what in "$@"; do
  IFS='|' read -r _ script settings _ <<< "$(entry "$what")"
  elapsed=$(( $(date +%s) - t0 ))
  echo "== device.sh $what: ${settings:+$settings }benchmarks/$script (${elapsed} s into the call)"
  # shellcheck disable=SC2086  # settings are NAME=value words
  env $settings BUDGET=$(( total - elapsed )) bash "benchmarks/$script"
  rc=$?
  echo "== device.sh $what: rc=$rc after $(( $(date +%s) - t0 )) s"
  [ $status -eq 0 ] && status=$rc
done
exit $status
