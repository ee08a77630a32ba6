# `make example` tunes the example on this machine; `make test` runs the tests.
# Both create the virtual environment .venv first if needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Without an NVIDIA GPU, take torch's CPU build (on this project's machines it lies on disk)
# before deepspeed asks for torch and pip downloads the CUDA build.
TORCH_CPU ?= torch==2.13.0
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAS_GPU),yes)
  export DS_ACCELERATOR ?= cuda
else
  export DS_ACCELERATOR ?= cpu
endif
# DeepSpeed JIT-builds the CPU ops its runs load (4-5 minutes on 2 cores) at the first run
# that needs them: `venv` builds them once, into the virtual environment's own extensions folder,
# with its own ninja first on PATH, as optuna-ds's experiments find them (launcher/_ops.py): a
# run with another folder or another ninja (1.11 and 1.13 read each other's build log as stale)
# would build them again.
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch_extensions
# Each op's progress on stderr (launcher/_ops.py), DeepSpeed's own build output dropped.
CPU_OPS := import sys; from optuna_ds.launcher import build_cpu_ops; build_cpu_ops(say=lambda line: print('make venv:', line, file=sys.stderr, flush=True))
PYTEST_ARGS ?=
# Test processes (pytest-xdist): the real-DeepSpeed tests run one after another in one of them
# (tests/conftest.py), the rest beside them. Most tests wait on processes they start.
PYTEST_WORKERS ?= 2
# The six hand-made surfaces and 100 generated jobs; DeepSpeed's figures come from its cache file.
BENCH_ARGS ?= --random 100
# optuna-ds's own tuning in-process (benchmarks/product.py), on the hand-made and 60 generated
# jobs of each generator and the jobs of recorded real runs (about 10 minutes on 2 cores).
PLANNER_ARGS ?= --random 60 --physical 60 --blind 60 --blind4 60 --replays
# `make bench-parallel PARALLEL_ARGS="--quick --scenarios 64"`: a part, scaled down.
PARALLEL_ARGS ?=

.PHONY: venv example test bench bench-planner bench-calibrate bench-parallel bench-launch bench-steps bench-real clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@echo "make venv: setting up $(VENV), once (5-10 minutes on 2 idle cores, longer on a busy machine; each step says what it waits for)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "make venv: upgrading pip (seconds)"
	$(BIN)/python -m pip install -q --upgrade pip
	@if [ "$(HAS_GPU)" != "yes" ]; then echo "make venv: no NVIDIA GPU: installing torch's CPU build first (about a minute)"; fi
	if [ "$(HAS_GPU)" != "yes" ]; then $(BIN)/python -m pip install -q "$(TORCH_CPU)"; fi
	@echo "make venv: installing optuna-ds, DeepSpeed and the extras (2-5 minutes)"
	$(BIN)/python -m pip install -q -e '.[test,postgres,mysql,hf,bench,xgboost]'
	@if [ "$(HAS_GPU)" != "yes" ]; then echo "make venv: building DeepSpeed's CPU ops into $(TORCH_EXTENSIONS_DIR) (4-5 minutes on 2 cores, its progress shown), so that no tuning waits for them"; fi
	if [ "$(HAS_GPU)" != "yes" ]; then PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -c "$(CPU_OPS)" >/dev/null; fi
	touch $@
	@echo "make venv: done"

example: venv
	cd examples && ../$(BIN)/optuna-ds tune --num_gpus 1 \
		train.py --deepspeed_config ds_config.json
	@echo "optimal config: examples/autotuning_results/ds_config_optimal.json"
	@echo "next: run it yourself (the same command resumes; DS_ACCELERATOR as make set it):"
	@echo "  source $(VENV)/bin/activate"
	@echo "  export DS_ACCELERATOR=$(DS_ACCELERATOR)"
	@echo "  cd examples && optuna-ds tune --num_gpus 1 train.py --deepspeed_config ds_config.json"

test: venv
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) examples/autotuning_results examples/autotuning_exps examples/hf/autotuning_* examples/hf/output_*

bench: venv
	$(BIN)/python benchmarks/search.py $(BENCH_ARGS)

bench-planner: venv
	$(BIN)/python benchmarks/planner.py $(PLANNER_ARGS)

# The simulation's costs against real processes (benchmarks/parallel.py's scenario 4, PostgreSQL).
bench-calibrate: venv
	$(BIN)/python benchmarks/product.py --calibrate --fit

bench-parallel: venv
	$(BIN)/python benchmarks/parallel.py $(PARALLEL_ARGS)

bench-launch: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/launch.py $(BENCH_ARGS)

bench-steps: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/steps.py $(STEPS_ARGS)

bench-real: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/real_job.py $(REAL_ARGS)
