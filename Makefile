PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench metadata clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpu-monitoring check --simulate dgx-h100

test: $(STAMP) lint
	$(BIN)/python -m pytest -q tests

lint: $(STAMP)
	$(BIN)/ruff check gpu_monitoring tests scripts setup.py

bench: $(STAMP)
	$(BIN)/python scripts/bench.py

metadata: $(STAMP)
	$(BIN)/gpu-monitoring metadata --write metadata.csv

clean:
	rm -rf $(VENV) build dist *.egg-info
