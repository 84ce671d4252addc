# One-command set-up: every target creates .venv if needed and installs into it the tested
# dependency versions of requirements.lock, then the package itself (editable, no dependencies).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LOCK   := requirements.lock

.PHONY: sweep test bench validate calibrate calibrate-published clean lock

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# pip check: the lock must satisfy pyproject.toml's ranges (a dependency added there and not
# locked yet stops here).
$(STAMP): $(BIN)/python pyproject.toml $(LOCK)
	$(BIN)/python -m pip install --quiet -r $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@out=$$($(BIN)/python -m pip check) || { echo "$$out" >&2; \
	  echo "$(LOCK) does not satisfy pyproject.toml's dependencies: run 'make lock'" >&2; exit 2; }
	touch $(STAMP)

# Refresh requirements.lock: install '.[test]' from pyproject.toml's ranges into a throw-away
# venv (newest versions the package index offers) and freeze it. Then run 'make test' and commit
# the lock if it passes.
lock:
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install --quiet --upgrade pip; \
	"$$tmp/venv/bin/python" -m pip install --quiet -e '.[test]'; \
	pyver=$$("$$tmp/venv/bin/python" -c 'import platform; print(platform.python_version(), platform.machine())'); \
	{ echo "# Tested dependency versions of vtrain_fast (runtime and test extras): 'make' installs"; \
	  echo "# exactly these (pip install -r $(LOCK), then pip install --no-deps -e .)."; \
	  echo "# Made by 'make lock' with Python $$pyver from pyproject.toml's ranges;"; \
	  echo "# refresh with 'make lock', then run 'make test' before committing it."; \
	  "$$tmp/venv/bin/python" -m pip freeze --exclude-editable | grep -v -i '^vtrain[-_]fast[=@ ]'; \
	} > "$$tmp/lock"; \
	mv "$$tmp/lock" $(LOCK); \
	echo "wrote $(LOCK) ($$(grep -c '==' $(LOCK)) pins, Python $$pyver)"

# The frontier per GPU (A100 40 GB, A100 80 GB, H100) of the 300B-token job: across GPUs the H100
# plans dominate, so one frontier would show no A100 plan.
sweep: $(STAMP)
	$(BIN)/vtrain-fast sweep sweeps/gpt3-175b-a100.toml --overwrite
	$(BIN)/vtrain-fast pareto results/gpt3-175b-a100 --by gpu --where 'num_tokens==3e11' --top 6

test: $(STAMP)
	$(BIN)/python -m pytest -q

validate: $(STAMP)
	$(BIN)/vtrain-fast validate --plot results/validation.png --overwrite

bench: $(STAMP)
	$(BIN)/python -m vtrain_fast.bench

clean:
	rm -rf results/*/ results/*.parquet results/*.png

# Refit the A100 calibration: NCCL tables first, then the iteration-time fit on the single-node set only.
# gemm_efficiency is not fitted: it stays at the preset's published value (gemm_efficiency in vtrain_fast/data/gpus/a100-sxm4-80gb.toml).
CAL := results/calibration-a100.toml
calibrate: $(STAMP)
	rm -f $(CAL)
	$(BIN)/vtrain-fast validate --write-measurements results/measurements -o results/validation-before.parquet --overwrite
	$(BIN)/vtrain-fast calibrate-nccl vtrain_fast/data/vtrain/nccl_allreduce_a100/*.csv --gpu a100-sxm4-80gb -o $(CAL)
	$(BIN)/vtrain-fast calibrate results/measurements/vtrain_single.csv --gpu a100-sxm4-80gb --calibration $(CAL) -o $(CAL) \
	  --param hbm_efficiency --param kernel_overhead_s --param host_launch_s \
	  --param iteration_overhead_s --param intra_node_latency_s --param intra_node_step_latency_s \
	  --param p2p_overhead_s
	$(BIN)/vtrain-fast validate --calibration $(CAL)

# Refit the stack calibrations of the published set (vtrain_fast/data/calibration/stack-*.toml, one
# per software stack of analysis/published.py: STACKS): a few global parameters per stack and GPU
# fitted to every other expressible row (CSV order); the rest held out. Then the validation.
calibrate-published: $(STAMP)
	$(BIN)/vtrain-fast calibrate-published -o vtrain_fast/data/calibration
	$(BIN)/vtrain-fast validate --set published
