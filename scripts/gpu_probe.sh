#!/usr/bin/env bash
# Where a tp=2 run on CUDA stalls (stacks of every rank after 60 s), then the single-stream peers table.
set -u
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 NCCL_DEBUG=WARN
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/scripts
probe() {  # name, args...
  python3 scripts/tp_probe.py "${@:2}" > "$OUT/probe_$1.txt" 2>&1 &
  local pid=$! i
  for i in $(seq 60); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then echo "STALLED, dumping stacks" >> "$OUT/probe_$1.txt"; pkill -ABRT -f tp_worker; sleep 2; kill -ABRT $pid; sleep 2; kill -9 $pid; pkill -9 -f tp_worker; fi
  wait $pid; echo "probe $1: rc=$?"; grep -E "^\[" "$OUT/probe_$1.txt" | tail -3 | cut -c1-200
}
probe eager --set cuda_graph=false
probe graph
timeout 100 python3 -m pytest -q tests/test_parity.py -k compile -p no:logging 2>&1 | tail -2
timeout 200 python3 -m llmbench ablate scenarios/peers/single_stream.yaml --out /tmp/results > "$OUT/peers_single.txt" 2>&1
tail -30 "$OUT/peers_single.txt"
tar czf "$OUT/results.tgz" -C /tmp results
