# One-command set-up: every target creates .venv if needed and installs the package into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: sweep test bench validate calibrate clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

sweep: $(STAMP)
	$(BIN)/vtrain-fast sweep sweeps/gpt3-175b-a100.toml --overwrite --pareto

test: $(STAMP)
	$(BIN)/python -m pytest -q

validate: $(STAMP)
	$(BIN)/vtrain-fast validate --plot results/validation.png

bench: $(STAMP)
	$(BIN)/python -m vtrain_fast.bench

clean:
	rm -rf results/*/ results/*.parquet results/*.png

# Refit the A100 calibration: NCCL tables first, then the iteration-time fit on the single-node set only.
# gemm_efficiency is not fitted: it stays at the preset's published value (hardware.A100_GEMM_EFFICIENCY).
CAL := results/calibration-a100.toml
calibrate: $(STAMP)
	rm -f $(CAL)
	$(BIN)/vtrain-fast validate --write-measurements results/measurements -o results/validation-before.parquet
	$(BIN)/vtrain-fast calibrate-nccl vtrain_fast/data/vtrain/nccl_allreduce_a100/*.csv --gpu a100-sxm4-80gb -o $(CAL)
	$(BIN)/vtrain-fast calibrate results/measurements/vtrain_single.csv --gpu a100-sxm4-80gb --calibration $(CAL) -o $(CAL) \
	  --param hbm_efficiency --param kernel_overhead_s --param host_launch_s \
	  --param iteration_overhead_s --param intra_node_latency_s --param intra_node_step_latency_s \
	  --param p2p_overhead_s
	$(BIN)/vtrain-fast validate --calibration $(CAL)
