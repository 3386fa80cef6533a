# GPU Scheduling Lab. Two commands matter:
#   make demo-cluster   set everything up, bring the local cluster up, run the first demo
#   make test           set everything up and run unit, component and e2e tests
# Everything the project needs is installed from here: a Python venv (.venv), the NVML
# shim (gcc), and the upstream Kubernetes binaries (built from Go modules, cached under
# ~/.cache/gpulab, so only the first run pays for the build).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
GPULAB := $(BIN)/gpulab

.PHONY: setup venv fake-gpu binaries lint test test-unit test-e2e bench down status clean \
        demo-cluster demo-device-plugin demo-hami demo-kueue \
        demo-coscheduling demo-numa demo-volcano

setup: venv fake-gpu binaries

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "make: error: $(PYTHON) not found; install Python 3.11+ (apt-get install python3 python3-venv)"; exit 2; }
	@echo "==> creating Python venv in $(VENV) and installing the lab (pip)"
	@$(PYTHON) -m venv $(VENV) || { echo "make: error: could not create a venv; install python3-venv (apt-get install python3-venv)"; exit 2; }
	@$(BIN)/pip install --quiet --upgrade pip
	@$(BIN)/pip install --quiet --progress-bar off -e '.[dev]'
	@touch $@

fake-gpu:
	@$(MAKE) --no-print-directory -C fake-gpu

binaries: venv
	@$(GPULAB) build

lint: venv
	@$(BIN)/ruff check .
	@$(BIN)/ruff format --check .

test: setup lint
	@$(BIN)/pytest -ra

test-unit: venv fake-gpu
	@$(BIN)/pytest -ra -m "not e2e"

test-e2e: setup
	@$(BIN)/pytest -ra -m e2e

bench: setup
	@$(BIN)/python -m bench.run

demo-cluster: setup
	@$(GPULAB) demo cluster

demo-hami: setup
	@$(GPULAB) demo hami --backend local --spec hami

demo-device-plugin: setup
	@$(GPULAB) demo device-plugin

demo-kueue: setup
	@$(GPULAB) demo kueue

demo-coscheduling: setup
	@$(GPULAB) demo coscheduling --backend local --spec scheduling

demo-numa: setup
	@$(GPULAB) demo numa --backend local --spec scheduling

demo-volcano: setup
	@$(GPULAB) demo volcano --backend local --spec volcano

down: venv
	@$(GPULAB) down

status: venv
	@$(GPULAB) status

clean:
	@$(MAKE) --no-print-directory -C fake-gpu clean
	rm -rf $(VENV) .pytest_cache .ruff_cache
