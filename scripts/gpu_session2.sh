#!/usr/bin/env bash
# Second GPU pass: the CUDA test suite alone, then engine timings one at a time. Logs go to $OUT.
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
timeout 240 python3 -m pytest -q -x tests/test_parity.py tests/test_api.py tests/test_loader.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
B="python3 scripts/engine_bench.py --model qwen3-0.6b"
run() { timeout "$1" $B "${@:2}" 2>&1 | grep -E '^\{|Error' | tee -a $OUT/engine.jsonl | cut -c1-200; }
run 60 --workload single --set cuda_graph=false
run 60 --workload single --set cuda_graph=true
run 120 --workload throughput --set cuda_graph=false
run 60 --workload throughput --set cuda_graph=true
run 240 --workload single --set cuda_graph=true --set torch_compile=true
