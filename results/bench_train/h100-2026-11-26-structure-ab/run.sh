#!/usr/bin/env bash
# bench_train at the commit before issue 20's structure work (d50b9c3^, "pre20") or at HEAD ("head"): GPT-2 124M,
# T = 4K and 16K, no dropout; each process times flash beside sdpa and the compiled nanoGPT-style reference.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
where=$([ "$1" = pre20 ] && echo .ab/pre20 || echo .)
cd $where && PYTHONPATH=/tmp/site:$PWD timeout 560 python scripts/bench_train.py --seq-lens 4096,16384 --dropout 0 \
  --providers reference,flash,sdpa --out $OUT/bench_train_$1.json 2>&1 | tail -12
