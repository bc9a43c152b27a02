#!/usr/bin/env bash
# Every published GPU number in one place: the commands behind README.md's and docs/benchmarks.md's tables, in
# parts that each fit a 10-minute GPU job. Run from the repository root on a CUDA machine; results go to $OUT
# (default results/gpu-<date>). hydra/omegaconf/wandb must be importable for the train.py parts
# (`pip install -e ".[train]"`, or the wheels of ../shared/tools/gpu-wheels.sh on a machine without network).
#
#   bash scripts/gpu_benchmarks.sh kernels   # attention kernel (default and deterministic backward) vs cuDNN /
#                                            # FlashAttention-2, D = 64 and 128, dropout 0 / 0.1, host time per call,
#                                            # and the GPU check at head dims 40..256
#   bash scripts/gpu_benchmarks.sh tune-backward  # the fused backward's tiles and the fused/split choice per shape
#   bash scripts/gpu_benchmarks.sh ab        # the working tree's kernels vs a baseline copy in .ab/ (one process)
#   bash scripts/gpu_benchmarks.sh ncu       # Nsight Compute: our fwd/bwd kernels and cuDNN's, D = 64, T = 16K
#   bash scripts/gpu_benchmarks.sh masks     # masked kernel vs compiled FlexAttention at T = 4K, 16K
#   bash scripts/gpu_benchmarks.sh mask-walks  # each mask's ceiling: our dense kernel on walks as short as its own,
#                                              # T = 4K, 16K, 64K, dropout 0 / 0.1
#   bash scripts/gpu_benchmarks.sh train     # train.py's step (naive/flash/sdpa) vs a compiled nanoGPT-style step
#   bash scripts/gpu_benchmarks.sh rope      # what rotary positions cost train.py's compiled step (flash, sdpa),
#                                            # after the GPU check of their fused gradient
#   bash scripts/gpu_benchmarks.sh masks64k  # GPT-2 124M at 64K: dense, sliding window, documents, block-sparse
#   bash scripts/gpu_benchmarks.sh context       # 2 GPUs: context parallelism at 64K (flash, sdpa) vs one GPU, and
#                                                # 20 steps at 16K on one GPU and CP=2 (their losses compared)
#   bash scripts/gpu_benchmarks.sh context-long  # 2 GPUs: CP=2 at 128K and 256K, with and without activation
#                                                # checkpointing
set -euo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout's flashgpt where it is not installed
OUT=${OUT:-results/gpu-$(date +%F)}
mkdir -p "$OUT"
# One train.py run of the context parts: NAME COMMAND... (train.py and its launcher); result and metrics to $OUT.
context_run() {
  local name=$1
  shift
  "$@" experiment=long_context_masks wandb.mode=disabled hydra.run.dir="/tmp/context/$name" \
    > "/tmp/context-$name.log" 2>&1 || tail -20 "/tmp/context-$name.log"
  cp "/tmp/context/$name/result.json" "$OUT/context-$name.json"
  cp "/tmp/context/$name/metrics.jsonl" "$OUT/context-$name.metrics.jsonl"
}
ONE_GPU=(python train.py)
CP2=(torchrun --standalone --nproc_per_node=2 train.py parallel.context=2)
case "${1:?part: kernels | tune-backward | ab | ncu | masks | mask-walks | train | rope | masks64k | context | context-long}" in
  kernels)
    python scripts/bench_attention.py --provider flash,flash_deterministic,sdpa_cudnn,sdpa_flash --head-dims 64 \
      --dropout 0,0.1 --out "$OUT/bench_attention_d64.json" 2>&1 | tee "$OUT/bench_attention_d64.log"
    python scripts/bench_attention.py --provider flash,flash_deterministic,sdpa_cudnn --head-dims 128 \
      --dropout 0,0.1 --out "$OUT/bench_attention_d128.json" 2>&1 | tee "$OUT/bench_attention_d128.log"
    python scripts/bench_attention.py --check-only --head-dims 40,80,96,160,256 --out "$OUT/check_head_dims.json" \
      2>&1 | tee "$OUT/check_head_dims.log"
    ;;
  tune-backward)
    python scripts/tune_attention.py --head-dims 64,128 --dropout 0,0.1 --passes bwd_fused \
      --out kernels/tuned_h100.json --log "$OUT/tune_fused.json" 2>&1 | tee "$OUT/tune_fused.log"
    ;;
  ab)  # a kernel change against a baseline copy of kernels/, prepared beside the checkout (.ab/ is git-ignored:
       # carry it to the GPU machine): mkdir -p .ab/baseline && git archive <ref> kernels | tar -x -C .ab/baseline
       # (under masks: scripts/ab_kernels.py --masks documents,local_global,...)
    python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes fwd,bwd --head-dims 64,128 \
      --seq-lens 1024,4096,16384 --dropout 0,0.1 --rounds 3 --out "$OUT/ab.json" 2>&1 | tee "$OUT/ab.log"
    ;;
  ncu)  # Nsight Compute on one fwd+bwd per provider (ours default and deterministic, cuDNN), D = 64, T = 16K
    ncu --clock-control none --profile-from-start off --set full -o "$OUT/attn_d64_16k" \
      python scripts/ncu_attention.py > "$OUT/ncu.log" 2>&1
    ncu --import "$OUT/attn_d64_16k.ncu-rep" --page details --csv > "$OUT/attn_d64_16k_details.csv"
    ;;
  masks)
    python scripts/bench_masks.py --seq-lens 4096,16384 --out "$OUT/bench_masks.json" 2>&1 | tee "$OUT/bench_masks.log"
    ;;
  mask-walks)
    for p in 0 0.1; do
      python scripts/bench_mask_walks.py --dropout $p --out "$OUT/bench_mask_walks_dropout_$p.json" 2>&1 \
        | tee "$OUT/bench_mask_walks_dropout_$p.log"
    done
    ;;
  train)
    python scripts/bench_train.py --providers reference,flash,sdpa --seq-lens 1024,4096,16384 --dropout 0,0.1 \
      --budget-min 8.3 --out "$OUT/bench_train.json" 2>&1 | tee "$OUT/bench_train.log"
    ;;
  rope)
    python scripts/check_rotary.py 2>&1 | tee "$OUT/check_rotary.log"
    python scripts/bench_train.py --providers flash,sdpa --positions learned,rope --seq-lens 1024,4096,16384 \
      --dropout 0 --budget-min 8.3 --out "$OUT/bench_train_rope.json" 2>&1 | tee "$OUT/bench_train_rope.log"
    ;;
  masks64k)
    # window128: almost no attention work left, so its tokens/s bounds what any mask can reach (Amdahl).
    for spec in "dense|" "window4k|attention.window_size=4096" "docmask|data.document_mask=true" \
      "strided10|attention.block_sparse.pattern=strided attention.block_sparse.density=0.1" \
      "window128|attention.window_size=128"; do
      name=${spec%%|*}
      # shellcheck disable=SC2086  # the overrides are words
      python train.py experiment=long_context_masks ${spec#*|} wandb.mode=disabled hydra.run.dir="/tmp/masks64k/$name" \
        > "/tmp/masks64k-$name.log" 2>&1 || tail -20 "/tmp/masks64k-$name.log"
      cp "/tmp/masks64k/$name/result.json" "$OUT/masks64k-$name.json"
    done
    ;;
  context)
    for backend in flash sdpa; do
      context_run "$backend-1gpu-64k" "${ONE_GPU[@]}" attention=$backend
      context_run "$backend-cp2-64k" "${CP2[@]}" attention=$backend
    done
    context_run loss-1gpu-16k "${ONE_GPU[@]}" seq_len=16384 train.max_steps=20
    context_run loss-cp2-16k "${CP2[@]}" seq_len=16384 train.max_steps=20
    ;;
  context-long)
    for seq_len in 131072 262144; do
      context_run "flash-cp2-$seq_len" "${CP2[@]}" seq_len=$seq_len
      context_run "flash-cp2-$seq_len-ac" "${CP2[@]}" seq_len=$seq_len model.activation_checkpointing=true
    done
    ;;
  *) echo "unknown part $1" >&2; exit 2 ;;
esac
