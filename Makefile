PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-sidecar bench-versus soak metadata clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[deps,dev]"
	touch $(STAMP)

# A simulated node run through its scenario's whole timeline of faults, one 15 s interval a run (seconds
# of wall time): the summary of the last run (GPUs, funnel, cost, service checks not OK), the service
# checks that changed and the events of every run, then every series of the last run.
# Another node: make demo SCENARIO=faults (`gpu-monitoring check --help` lists the scenarios).
SCENARIO ?= dgx-h100

# Exit status 3 says a service check is CRITICAL: what a faulty scenario is there to show.
demo: $(STAMP)
	$(BIN)/gpu-monitoring check --simulate $(SCENARIO) --whole-timeline --series || [ $$? -eq 3 ]

# Agents ship protobuf 4.21 through 7.x: the Kubernetes attribution tests run under both ends, side by side.
ATTRIBUTION_TESTS = $(wildcard tests/test_pod_resources*.py) tests/test_kubelet.py $(wildcard tests/test_attribution*.py)

test: $(STAMP) lint
	$(BIN)/python -m pytest -q -n 3 tests
	scripts/attribution_protobuf.sh $(ATTRIBUTION_TESTS)
	scripts/validate_assets.sh

lint: $(STAMP)
	$(BIN)/ruff check gpu_monitoring tests scripts setup.py

# The bench's plot needs matplotlib, which `make test` does not: the `bench` extra, installed once.
BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[deps,dev,bench]"
	touch $(BENCH_STAMP)

# NVML calls, CPU against the submission floor, a profile, scaling and memory; writes docs/PERFORMANCE.md,
# docs/performance.png, docs/performance.json and the README's figures (its wall time among them;
# BENCH_RUNS=10000 for a longer memory run than its 2,000).
bench: $(BENCH_STAMP)
	$(BIN)/python scripts/bench.py

# The sidecar's snapshot latency and memory over 10,000 snapshots, and the journal's throughput (minutes).
bench-sidecar: $(STAMP)
	$(BIN)/python scripts/sidecar_bench.py
	$(BIN)/python scripts/journal_bench.py

# Own CPU per series over the floor, this tree against BASE (a git revision), both interleaved in one run;
# PROFILE=full for the metrics profile the CPU bar is set on.
PROFILE ?= standard

bench-versus: $(STAMP)
	$(BIN)/python scripts/bench_versus.py --base $(BASE) --metrics-profile $(PROFILE)

# 10,000 runs in local and sidecar mode while faults cycle, the sidecar killed every 1,000 (minutes).
soak: $(STAMP)
	$(BIN)/python scripts/soak.py

# metadata.csv and gpu_monitoring/metrics/names.py from gpu_monitoring/metrics/metrics.yaml.
metadata: $(STAMP)
	$(BIN)/gpu-monitoring metadata --write metadata.csv
	$(BIN)/python -m gpu_monitoring.metrics.write_names

# conf.yaml.example and gpu_monitoring/config_models/ from assets/configuration/spec.yaml.
config: $(STAMP)
	$(BIN)/python scripts/generate_config.py

clean:
	rm -rf $(VENV) .venv-protobuf-* .venv-agent-* .venv-ddev .venv-sidecar build dist *.egg-info
