# One-command set-up: every target creates .venv if needed and installs the package into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: sweep test bench validate clean

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
