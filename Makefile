# The two commands a fresh machine needs: `make run` (set up, then run the default scenario) and
# `make test` (set up, then the test suite). Set-up is a virtual environment in .venv.
PYTHON ?= python3
VENV ?= .venv
# torch 2.13.0 is a local CPU build on the development machines; on a GPU machine set TORCH=torch
# (or install into an environment that already has a CUDA torch and use `make run VENV=...`).
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
SCENARIO ?= scenarios/chat.yaml
PYTEST_ARGS ?=
# tests run in this many processes (pytest-xdist); 2 suits a 2-core machine
TEST_WORKERS ?= 2

.PHONY: setup run test test-fast lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

run: setup
	$(BIN)/llmbench run $(SCENARIO)

test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(BIN)/python -m ruff check llmbench tests devtools
	$(BIN)/python -m ruff format --check llmbench tests devtools

# On a GPU machine whose Python already holds torch and triton (from the repository's root, no venv):
# every measurement behind BENCHMARKS.md, into $(BENCH_OUT); then `llmbench docs` regenerates the tables from
# the folders they name. In parts, each a few minutes on an H200; bench-tp needs two GPUs.
BENCH_OUT ?= results/h200
LLMBENCH = PYTHONPATH=. $(PYTHON) -m llmbench
ABLATE = $(LLMBENCH) ablate --repeats 3 --timeout 600 --out $(BENCH_OUT)
PROFILE = $(LLMBENCH) profile --out $(BENCH_OUT)/profiles
.PHONY: bench bench-check bench-runs bench-ablations bench-profiles bench-tp
bench: bench-check bench-runs bench-ablations bench-profiles

bench-check:  # the GPU-only tests, the machine's peaks, the kernels at real sizes against their references
	PYTHONPATH=. $(PYTHON) -m pytest -q -m gpu tests
	$(LLMBENCH) calibrate
	PYTHONPATH=. $(PYTHON) devtools/bench_kernels.py --json $(BENCH_OUT)/kernels.json
	PYTHONPATH=. $(PYTHON) devtools/bench_sampler.py
	PYTHONPATH=. $(PYTHON) devtools/bench_overlap.py --json $(BENCH_OUT)/overlap.json
	PYTHONPATH=. $(PYTHON) devtools/bench_kernels.py --tune decode-layout --tune-only --json $(BENCH_OUT)/kernels-layout.json
	PYTHONPATH=. $(PYTHON) devtools/bench_kernels.py --tune prefill-prompts --tune-only --json $(BENCH_OUT)/kernels-prefill-prompts.json
	PYTHONPATH=. $(PYTHON) devtools/bench_kernels.py --tune decode-slices --tune-only --json $(BENCH_OUT)/kernels-slices.json
	PYTHONPATH=. $(PYTHON) devtools/bench_kernels.py --tune decode-balanced --tune-only --json $(BENCH_OUT)/kernels-balanced.json
	PYTHONPATH=. $(PYTHON) devtools/bench_kernels.py --tune prefill-lengths --tune-only --json $(BENCH_OUT)/kernels-prefill-lengths.json
	PYTHONPATH=. $(PYTHON) devtools/bench_kernels.py --tune decode-ceiling --tune-only --json $(BENCH_OUT)/kernels-ceiling.json
	PYTHONPATH=. $(PYTHON) devtools/bench_kernels.py --tune decode-rows --tune-only --json $(BENCH_OUT)/kernels-rows.json
	PYTHONPATH=. $(PYTHON) devtools/bench_kernels.py --tune decode-placement --tune-only --json $(BENCH_OUT)/kernels-placement.json
	PYTHONPATH=. $(PYTHON) devtools/splitk_matmul.py --json $(BENCH_OUT)/splitk.json

bench-runs:  # every scenario under scenarios/bench/ at the defaults
	for f in scenarios/bench/*.yaml; do $(LLMBENCH) run $$f --out $(BENCH_OUT) || exit 1; done

bench-ablations:  # what sampling, the float8 KV cache, CUDA Graphs, torch.compile and prefix caching are worth
	$(ABLATE) scenarios/bench/throughput.yaml --toggle sampling.temperature=0,0.6
	$(ABLATE) scenarios/bench/throughput.yaml --toggle kv_cache_dtype --quality
	$(ABLATE) scenarios/bench/fixed_64_0.6b.yaml --toggle kv_cache_dtype
	$(ABLATE) scenarios/bench/fixed_64_0.6b.yaml --set engine.kv_cache_dtype=fp8_e4m3 --toggle tuning.decode_uniform_tiling
	$(ABLATE) scenarios/bench/throughput.yaml --set workload.num_requests=32 --toggle torch_compile \
	  --toggle dtype=bfloat16,float16 --toggle attention_backend=triton,sdpa --toggle triton_kernels \
	  --design one-at-a-time --quality --repeats 1
	$(ABLATE) scenarios/bench/throughput_8b.yaml --set workload.num_requests=16 \
	  --set 'workload.output_len={dist: uniform, min: 16, max: 64}' --toggle torch_compile \
	  --toggle dtype=bfloat16,float16 --toggle attention_backend=triton,sdpa --toggle triton_kernels \
	  --design one-at-a-time --quality --repeats 1
	$(LLMBENCH) ablate --repeats 10 --timeout 600 --out $(BENCH_OUT) scenarios/bench/single_0.6b.yaml \
	  --toggle sampling.temperature=0,0.6
	for f in scenarios/bench/single_0.6b.yaml scenarios/bench/batch8_0.6b.yaml; do \
	  $(ABLATE) $$f --toggle cuda_graph --toggle torch_compile --toggle async_scheduling --design one-at-a-time \
	  || exit 1; done
	$(ABLATE) scenarios/bench/throughput.yaml --toggle cuda_graph --toggle async_scheduling \
	  --toggle triton_kernels --toggle continuous_batching --design one-at-a-time
	$(ABLATE) scenarios/bench/throughput.yaml --toggle paged_kv --toggle chunked_prefill --toggle prefix_cache \
	  --design one-at-a-time
	$(ABLATE) scenarios/prefix_sharing.yaml --toggle prefix_cache
	$(ABLATE) scenarios/chat.yaml --toggle tuning.prefill_graphs
	$(ABLATE) scenarios/bench/throughput_greedy.yaml --toggle tuning.prefill_graphs
	$(ABLATE) scenarios/bench/throughput_8b_greedy.yaml --toggle tuning.prefill_graphs
	$(ABLATE) scenarios/bench/single_0.6b.yaml --toggle tuning.programmatic_launch_rows=32,0
	$(ABLATE) scenarios/bench/batch8_0.6b.yaml --set engine.tuning.skinny_matmul_rows=8 \
	  --toggle tuning.programmatic_launch_rows=0,256
	$(ABLATE) scenarios/bench/fixed_64_0.6b.yaml --toggle tuning.programmatic_launch_rows=0,256
	$(ABLATE) scenarios/bench/throughput_greedy.yaml --toggle tuning.programmatic_launch_rows=0,32,128
	$(ABLATE) scenarios/bench/batch8_0.6b.yaml --toggle tuning.skinny_matmul_rows=1,8
	$(ABLATE) scenarios/bench/batch8_0.6b.yaml --set workload.num_requests=16 --set arrival.concurrency=16 \
	  --toggle tuning.skinny_matmul_rows=8,16
	$(ABLATE) scenarios/bench/batch8_0.6b.yaml --set workload.num_requests=32 --set arrival.concurrency=32 \
	  --toggle tuning.skinny_matmul_rows=8,16,32
	$(ABLATE) scenarios/bench/fixed_64_0.6b.yaml --set engine.tuning.programmatic_launch_rows=64 \
	  --toggle tuning.skinny_matmul_rows=1,32,64
	$(ABLATE) scenarios/bench/throughput_greedy.yaml --toggle tuning.skinny_matmul_rows=8,64
	$(ABLATE) scenarios/bench/throughput_greedy.yaml --toggle max_num_batched_tokens=8192,16384
	$(ABLATE) scenarios/bench/throughput_greedy.yaml --toggle tuning.prefill_narrow_tiles_up_to=0
	$(ABLATE) scenarios/chat.yaml --toggle tuning.prefill_narrow_tiles_up_to=0
	$(ABLATE) scenarios/bench/throughput.yaml --toggle torch_compile
	$(ABLATE) scenarios/bench/throughput_greedy.yaml --set engine.tuning.programmatic_launch_rows=256 \
	  --toggle tuning.skinny_matmul_rows=128
	for n in 16 64; do $(ABLATE) scenarios/bench/batch8_0.6b.yaml --set model=qwen3-8b --set workload.num_requests=$$n \
	  --set arrival.concurrency=$$n --set engine.tuning.skinny_matmul_rows=$$n --toggle tuning.skinny_matmul_rows=1 \
	  || exit 1; done

bench-profiles:  # where each variant's time goes
	for t in cuda_graph triton_kernels; do \
	  $(PROFILE) scenarios/bench/single_0.6b.yaml --toggle $$t --steps 50 || exit 1; \
	  $(PROFILE) scenarios/bench/throughput.yaml --toggle $$t --steps 20 || exit 1; done
	$(PROFILE) scenarios/chat.yaml --slow-steps --steps 20
	$(PROFILE) scenarios/bench/throughput_greedy.yaml --toggle tuning.prefill_graphs --steps 20
	$(PROFILE) scenarios/bench/throughput.yaml --toggle sampling.temperature=0 --steps 20
	$(PROFILE) scenarios/bench/single_0.6b.yaml --toggle sampling.temperature=0,0.6 --steps 50

bench-tp:  # two GPUs of one host
	$(ABLATE) scenarios/bench/single_8b.yaml --toggle tp
	$(ABLATE) scenarios/bench/single_8b.yaml --set engine.tp=2 --toggle tuning.tp_fuse_matmul --toggle tuning.tp_fuse_norm \
	  --design one-at-a-time
	$(ABLATE) scenarios/bench/throughput_8b.yaml --toggle tp

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
