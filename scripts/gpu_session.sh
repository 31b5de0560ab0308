#!/usr/bin/env bash
# GPU-machine work in stages, each step under its own time limit; after every step the result folders
# and the logs are packed into $OUT/results.tgz (so a stage cut short keeps what it measured).
#
#   bash scripts/gpu_session.sh STAGE...     stages: check tp tp2 prof skinny final arnorm armm tp_arnorm tp_workload pdl fusion tp_async peers bench ablate ablate2 fa4a fa4b fa4c fa4
#
#   tests   CUDA test suite (kernels at real sizes, parity in float32)
#   check   CUDA test suite (kernels at real sizes, parity in float32), then scripts/bench_kernels.py
#   tp      (two GPUs) tensor-parallel tests, tp=1 vs tp=2 on qwen3-8b: one sequence and nano-vllm workload
#   tp2     (two GPUs) per-rank profiles (with and without Nagle on the step socket, NCCL and one-shot
#           all-reduce), then tp_all_reduce, tp x async_scheduling and tp on the workload as ablations
#   prof    (two GPUs) llmbench profile of one sequence, kernels by category: qwen3-8b at tp=1 and
#           tp=2 (NCCL and one-shot all-reduce), qwen3-0.6b
#   skinny  (two GPUs) the skinny Triton matmul against cuBLAS: kernel sweep at 2-8 rows (GPU 1) beside one
#           sequence of qwen3-8b and qwen3-0.6b (GPU 0); then tp=1 vs tp=2 with it, and profiles
#   final   (two GPUs) the skinny kernels' tests, fused against unfused profiles, every bench scenario, tp
#   arnorm  (two GPUs) tp_fuse_norm: scripts/allreduce_probe.py (checks and times it on real ranks), its tests,
#           tp=2 with and without it on one qwen3-8b sequence
#   armm    (two GPUs) tp_fuse_matmul: scripts/allreduce_probe.py --matmul, its tests, tp=2 with and without it
#   tp_arnorm (two GPUs) tp=1 vs tp=2 at the defaults on one qwen3-8b sequence, and tp=2's profile
#   tp_workload (two GPUs) the nano-vllm workload on qwen3-8b, tp=1 against tp=2
#   pdl     (two GPUs) programmatic dependent launch: parity tests, then pdl x tp on one qwen3-8b sequence
#   fusion  one sequence (qwen3-8b, qwen3-0.6b) with skinny_fusion all, silu, none
#   tp_async (two GPUs) tp x async_scheduling on one qwen3-8b sequence
#   peers   engine vs transformers: single stream and the nano-vllm workload (issue 7's table)
#   bench   every scenarios/bench/*.yaml through llmbench run (issue 4's targets)
#   ablate  async_scheduling and torch_compile one at a time, on batch 1 and batch 8 (qwen3-0.6b)
#   ablate2 every toggle one at a time on the nano-vllm workload
#   fa4a, fa4b, fa4c, fa4   flash-attn 4 carried in three calls (scripts/fetch_fa4_wheels.sh), then the flash_attn
#           backend: parity tests, and against triton on the workload and one sequence
#
# pydantic travels as wheels in .whl (shared/GPU.md); pass `carry: [".whl"]` to the device call.
# One-GPU stages can run side by side on a two-GPU machine, each with its own tarball:
#   TAG=-a CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_session.sh ablate & TAG=-b CUDA_VISIBLE_DEVICES=1 bash ... & wait
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -d .whl ] && [ ! -d /tmp/site/pydantic ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD:$PWD/scripts
R=/tmp/results
LB="python3 -m llmbench"
PYTEST="python3 -m pytest -q -rs -p no:logging -p no:cacheprovider --timeout 150"

L=/tmp/logs; mkdir -p $L $R
step() {  # name, seconds, command...  (logs and results travel in one tarball: $OUT takes 8 files)
  echo "== $1 ($(date +%T))"
  timeout -k 10 "$2" "${@:3}" > "$L/$1.txt" 2>&1
  echo "rc=$?"
  grep -E "passed|failed|tok/s|TPOT p50|TTFT p50|timed out|error" "$L/$1.txt" | grep -v DEBUG | cut -c1-170 | tail -12
  tar czf "$OUT/results${TAG:-}.tgz" -C /tmp results logs 2>/dev/null
}

for stage in "$@"; do
  case $stage in
    check|tests)
      step tests_cuda 250 $PYTEST tests/test_kernels.py tests/test_parity.py tests/test_staging.py
      [ "$stage" = tests ] && continue
      step kernels 150 python3 scripts/bench_kernels.py --json "$L/kernels.json" ;;
    tp2)  # (two GPUs) the tp=2 stall traced (Nagle on the step socket?), one-shot all-reduce in whole runs
      T="$LB profile scenarios/bench/single_8b.yaml --set engine.tp=2 --steps 100 --out $R"
      step tp_trace_nagle 150 env LLMBENCH_TP_NODELAY=0 $T --set engine.async_scheduling=true
      step tp_trace 150 $T --set engine.async_scheduling=true
      step tp_trace_symm 150 $T --set engine.async_scheduling=true --set engine.tp_all_reduce=symm_mem
      step tp_trace_sync_symm 150 $T --set engine.tp_all_reduce=symm_mem
      step tp_symm 150 $LB ablate scenarios/bench/single_8b.yaml --set engine.tp=2 \
        --set engine.async_scheduling=true --toggle tp_all_reduce=nccl,symm_mem --repeats 2 --timeout 60 --out $R
      step tp_async 240 $LB ablate scenarios/bench/single_8b.yaml --set engine.tp_all_reduce=auto --toggle tp \
        --toggle async_scheduling --design factorial --repeats 2 --timeout 60 --out $R
      step tp_throughput 150 $LB ablate scenarios/bench/throughput.yaml --set model=qwen3-8b \
        --set name=bench-throughput-8b --set warmup=4 --set engine.tp_all_reduce=auto --toggle tp \
        --repeats 1 --timeout 120 --out $R ;;
    prof)  # (two GPUs) where a decode step's time goes, by kind of kernel: one sequence, qwen3-8b at tp=1
      # and tp=2 (both all-reduces), qwen3-0.6b
      P="$LB profile scenarios/bench/single_8b.yaml --steps 150 --out $R"
      step prof_8b_tp1 150 $P
      step prof_8b_tp2_nccl 150 $P --set engine.tp=2 --set engine.tp_all_reduce=nccl
      step prof_8b_tp2_symm 150 $P --set engine.tp=2 --set engine.tp_all_reduce=symm_mem
      step prof_0.6b 120 $LB profile scenarios/bench/single_0.6b.yaml --steps 150 --out $R ;;
    skinny)  # (two GPUs) about 8 minutes
      A="$LB ablate --toggle skinny_matmul_rows=0,1 --timeout 60 --out $R"
      ( CUDA_VISIBLE_DEVICES=1 timeout 200 python3 scripts/bench_gemv.py --sweep --rows 2 4 8 \
          --json $L/gemv_rows.json > $L/gemv_rows.txt 2>&1 &
        CUDA_VISIBLE_DEVICES=0 step skinny_8b 200 $A scenarios/bench/single_8b.yaml --repeats 3
        CUDA_VISIBLE_DEVICES=0 step skinny_0.6b 100 $A scenarios/bench/single_0.6b.yaml --repeats 3
        wait )
      grep -v "^  Tiles" $L/gemv_rows.txt | tail -40
      step skinny_tp 300 $LB ablate scenarios/bench/single_8b.yaml --toggle tp --repeats 3 --timeout 60 --out $R
      P="$LB profile scenarios/bench/single_8b.yaml --steps 150 --out $R"
      step prof_8b_tp1_skinny 150 $P
      step prof_8b_tp2_skinny 150 $P --set engine.tp=2 ;;
    final)  # (two GPUs) about 6 minutes: the fusions profiled, the bench targets, tp, the skinny toggle
      P="$LB profile scenarios/bench/single_8b.yaml --steps 150 --out $R"
      ( { CUDA_VISIBLE_DEVICES=1 step tests_skinny 200 $PYTEST tests/test_kernels.py tests/test_parity.py \
            -k "skinny or (per_attention_backend and triton)"
          CUDA_VISIBLE_DEVICES=1 step skinny_0.6b 150 $LB ablate scenarios/bench/single_0.6b.yaml \
            --toggle skinny_matmul_rows=0,1 --repeats 3 --timeout 60 --out $R; } &
        CUDA_VISIBLE_DEVICES=0 step prof_8b_fusion 200 $P --toggle skinny_fusion=all,none
        CUDA_VISIBLE_DEVICES=0 step prof_0.6b_fusion 150 $LB profile scenarios/bench/single_0.6b.yaml --steps 150 \
          --toggle skinny_fusion=all,none --out $R
        for f in scenarios/bench/*.yaml; do
          CUDA_VISIBLE_DEVICES=0 step "bench_$(basename "$f" .yaml)" 150 $LB run "$f" --out $R
        done
        wait )
      step tp_single 200 $LB ablate scenarios/bench/single_8b.yaml --toggle tp --repeats 3 --timeout 60 --out $R ;;
    arnorm)  # (two GPUs) the all-reduce fused with the norm after it (tp_fuse_norm): checked on real ranks
      # and timed against the one-shot all-reduce + norm, its tests, then what it is worth at tp=2
      step ar_probe 100 python3 scripts/allreduce_probe.py --rows 1,8,64,256
      if ! grep -q "fused all-reduce + norm: equal" $L/ar_probe.txt; then
        pkill -f allreduce_probe; tail -5 $L/ar_probe.txt; exit 1
      fi
      step tests_arnorm 200 $PYTEST tests/test_kernels.py tests/test_tensor_parallel.py \
        -k "allreduce or symm_mem or auto or slot or fuse_norm"
      step tp_fuse 200 $LB ablate scenarios/bench/single_8b.yaml --set engine.tp=2 --toggle tp_fuse_norm \
        --repeats 3 --timeout 60 --out $R ;;
    armm)  # (two GPUs) the product fused in too (tp_fuse_matmul): checked and timed on real ranks, its tests,
      # then what it is worth at tp=2
      [ -n "${NO_PROBE:-}" ] || step mm_probe 120 python3 scripts/allreduce_probe.py --matmul --rows 1,2
      [ -n "${NO_PROBE:-}" ] || if ! grep -q "fused: the sum equal" $L/mm_probe.txt; then
        pkill -f allreduce_probe; tail -5 $L/mm_probe.txt; exit 1
      fi
      step tests_armm 150 $PYTEST tests/test_kernels.py tests/test_tensor_parallel.py \
        -k "allreduce or (each_product and True)"
      step tp_single 220 $LB ablate scenarios/bench/single_8b.yaml --toggle tp --repeats 3 --timeout 60 --out $R
      step tp_fuse_mm 180 $LB ablate scenarios/bench/single_8b.yaml --set engine.tp=2 --toggle tp_fuse_matmul \
        --repeats 2 --timeout 60 --out $R ;;
    tp_arnorm)  # (two GPUs) tp=1 against tp=2 at the defaults, and where tp=2's step goes now
      step tp_single 200 $LB ablate scenarios/bench/single_8b.yaml --toggle tp --repeats 3 --timeout 60 --out $R
      step prof_8b_tp2_fused 150 $LB profile scenarios/bench/single_8b.yaml --steps 150 --set engine.tp=2 \
        --out $R ;;
    pdl)  # (two GPUs) programmatic dependent launch: its parity tests, then pdl x tp on one qwen3-8b sequence
      step tests_pdl 150 $PYTEST tests/test_parity.py tests/test_kernels.py -k "programmatic or skinny_matmul_matches"
      grep -q " passed" $L/tests_pdl.txt && ! grep -q "failed" $L/tests_pdl.txt || exit 1
      step pdl_tp 300 $LB ablate scenarios/bench/single_8b.yaml --toggle pdl --toggle tp --design factorial \
        --repeats 2 --timeout 60 --out $R ;;
    tp_workload)  # (two GPUs) the nano-vllm workload on qwen3-8b at tp=1 and tp=2, today's defaults
      step tp_throughput 400 $LB ablate scenarios/bench/throughput.yaml --set model=qwen3-8b \
        --set name=bench-throughput-8b --set warmup=4 --toggle tp --repeats 1 --timeout 150 --out $R ;;
    fusion)  # which fusions pay: one sequence of qwen3-8b and qwen3-0.6b with each LLMBENCH_SKINNY_FUSION
      for fu in all silu none; do
        for m in 8b 0.6b; do
          step "fusion_${fu}_$m" 100 $LB run scenarios/bench/single_$m.yaml --set engine.skinny_fusion=$fu \
            --set name=fusion-$fu-$m --out $R
        done
      done ;;
    tp_async)  # (two GPUs) tp x async_scheduling on one qwen3-8b sequence: does overlapping host work help tp?
      step tp_async 180 $LB ablate scenarios/bench/single_8b.yaml --toggle tp --toggle async_scheduling \
        --design factorial --repeats 2 --timeout 60 --out $R ;;
    tp)
      step tests_tp 200 $PYTEST tests/test_tensor_parallel.py
      step tp_single 150 $LB ablate scenarios/bench/single_8b.yaml --toggle tp --timeout 90 --out $R
      step tp_throughput 220 $LB ablate scenarios/bench/throughput.yaml --set model=qwen3-8b \
        --set name=bench-throughput-8b --set warmup=4 --toggle tp --repeats 1 --timeout 120 --out $R ;;
    peers)
      step peers_single 150 $LB ablate scenarios/peers/single_stream.yaml --repeats 3 --timeout 60 --out $R
      step peers_throughput 400 $LB ablate scenarios/peers/throughput.yaml --repeats 1 --set warmup=2 \
        --timeout 300 --out $R ;;
    bench)
      for f in scenarios/bench/*.yaml; do
        step "bench_$(basename "$f" .yaml)" 150 $LB run "$f" --out $R
      done ;;
    ablate)  # about 6 minutes: async scheduling and torch.compile, one at a time, at batch 1 and batch 8
      step ablate_single_0.6b 250 $LB ablate scenarios/bench/single_0.6b.yaml --toggle async_scheduling \
        --toggle torch_compile --design one-at-a-time --repeats 3 --timeout 120 --out $R
      step ablate_batch8_0.6b 200 $LB ablate scenarios/bench/batch8_0.6b.yaml --toggle async_scheduling \
        --toggle torch_compile --design one-at-a-time --repeats 2 --timeout 120 --out $R ;;
    ablate2)  # about 7 minutes: every toggle one at a time on the nano-vllm workload
      step ablate_all 500 $LB ablate scenarios/bench/throughput.yaml --design one-at-a-time --repeats 1 \
        --set warmup=2 --timeout 100 --out $R \
        $(for t in paged_kv prefix_cache continuous_batching chunked_prefill triton_kernels attention_backend \
          cuda_graph async_scheduling; do echo --toggle $t; done) ;;
    fa4a|fa4b)  # a part of the flash-attn 4 wheels (scripts/fetch_fa4_wheels.sh): kept in /tmp while warm
      mkdir -p /tmp/fa4 && cp .$stage/* /tmp/fa4/ && ls /tmp/fa4 | wc -l ;;
    fa4c)  # the last part: rebuild the large wheel, install all of them beside pydantic
      cp .fa4c/cu13.part.* /tmp/fa4/ && cat /tmp/fa4/cu13.part.* > "/tmp/fa4/$(cat .fa4c/cu13.name)" \
        && rm /tmp/fa4/cu13.part.* \
        && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/fa4/*.whl \
        && echo "flash-attn 4 installed" ;;
    fa4)  # the flash_attn backend inside the engine (needs fa4c in this call or a warm machine's /tmp/site)
      export PYTHONPATH=$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages  # what its .pth would add
      python3 -c "import flash_attn.cute; print('flash_attn.cute imports')" 2>&1 | tail -1
      step tests_fa4 200 $PYTEST tests/test_kernels.py -k "flash_attn"
      step fa4_throughput 300 $LB ablate scenarios/bench/throughput.yaml --toggle attention_backend=triton,flash_attn \
        --repeats 2 --timeout 120 --out $R
      step fa4_single 200 $LB ablate scenarios/bench/single_0.6b.yaml --toggle attention_backend=triton,flash_attn \
        --repeats 3 --timeout 90 --out $R ;;
    *) echo "unknown stage $stage (check tp tp2 prof skinny final arnorm tp_arnorm tp_workload pdl fusion tp_async peers bench ablate ablate2 fa4a fa4b fa4c fa4)"; exit 2 ;;
  esac
done
