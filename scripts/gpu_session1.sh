#!/usr/bin/env bash
# First GPU pass: correctness on CUDA, kernel timings, engine baselines. Logs go to $OUT.
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $OUT/gpu.txt
python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)'
timeout 200 python3 -m pytest -q -x tests/test_parity.py tests/test_api.py tests/test_kernels.py 2>&1 | tail -15 | tee $OUT/tests.txt
timeout 120 python3 scripts/bench_kernels.py --json $OUT/kernels.json 2>&1 | tail -30 | tee $OUT/kernels.txt
B="python3 scripts/engine_bench.py --model qwen3-0.6b"
for w in single throughput; do
  for cfg in "attention_backend=sdpa triton_kernels=false cuda_graph=false" \
             "attention_backend=triton triton_kernels=true cuda_graph=false" \
             "attention_backend=triton triton_kernels=true cuda_graph=true"; do
    sets=""; for kv in $cfg; do sets="$sets --set $kv"; done
    timeout 150 $B --workload $w $sets 2>&1 | tail -3 | tee -a $OUT/engine.jsonl
  done
done
