#!/usr/bin/env bash
# Tensor parallelism on two H200s (issue 5) and the peer tables (issue 7), one step after another, each
# under its own time limit; the results folder is packed into $OUT after every step.
#   bash scripts/gpu_tp.sh        (pydantic as wheels in .whl)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/results
step() {  # name, seconds, command...
  echo "== $1"; timeout "$2" "${@:3}" > "$OUT/$1.txt" 2>&1; echo "rc=$?"
  grep -E "passed|failed|tok/s|TPOT p50|TTFT p50|^variant|^backend|^tp=|^baseline|error" "$OUT/$1.txt" | grep -v DEBUG | cut -c1-160 | tail -14
  tar czf "$OUT/results.tgz" -C /tmp results 2>/dev/null
}
step tests 150 python3 -m pytest -q -rs -p no:logging tests/test_tensor_parallel.py
step tp_single 150 python3 -m llmbench ablate scenarios/bench/single_8b.yaml --toggle tp --out $R
step tp_throughput 200 python3 -m llmbench ablate scenarios/bench/throughput.yaml --set model=qwen3-8b \
  --set name=bench-throughput-8b --set warmup=4 --toggle tp --repeats 1 --out $R
step peers_single 100 python3 -m llmbench ablate scenarios/peers/single_stream.yaml --repeats 3 --out $R
step peers_throughput 120 python3 -m llmbench ablate scenarios/peers/throughput.yaml --set workload.num_requests=64 \
  --set warmup=2 --repeats 1 --out $R
