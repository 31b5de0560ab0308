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

.PHONY: setup run test test-fast lint bench clean

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
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(BIN)/python -m ruff check llmbench tests scripts
	$(BIN)/python -m ruff format --check llmbench tests scripts

# On the GPU machine (its own python holds torch/triton): every scenario under scenarios/bench/, then
# the CUDA Graph / torch.compile / async scheduling ablations of issue 4, results under results/.
# (scripts/gpu_session.sh runs the same and more in stages, each under a time limit.)
BENCH_OUT ?= results
bench:
	for f in scenarios/bench/*.yaml; do PYTHONPATH=. $(PYTHON) -m llmbench run $$f --out $(BENCH_OUT) || exit 1; done
	for f in scenarios/bench/single_0.6b.yaml scenarios/bench/batch8_0.6b.yaml; do \
	  PYTHONPATH=. $(PYTHON) -m llmbench ablate $$f --toggle cuda_graph --toggle torch_compile \
	    --toggle async_scheduling --design one-at-a-time --timeout 300 --out $(BENCH_OUT) || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
