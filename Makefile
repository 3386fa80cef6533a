# GPU Scheduling Lab. Two commands matter:
#   make demo-cluster   set everything up, bring the local cluster up, run the first demo
#   make test           set everything up and run unit, component and e2e tests (the kind
#                       lane included: real kubelets in Docker)
# Everything the project needs is installed from here: a Python venv (.venv), the NVML
# shim (gcc), the upstream Kubernetes binaries (built from Go modules, cached under
# ~/.cache/gpulab, so only the first run pays for the build) and, for the kind backend, a
# Docker engine and the images (`make images`).
# Demos and labs run on the local backend; GPULAB_BACKEND=kind make demo-<chapter> runs the
# same chapter on kind.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
GPULAB := $(BIN)/gpulab

.PHONY: setup venv bytecode fake-gpu binaries test-peers images lint test test-unit test-e2e bench down status clean \
        demo-cluster demo-device-plugin demo-hami demo-kueue dashboard dashboard-web chromium \
        test-dashboard bench-dashboard \
        demo-coscheduling demo-numa demo-volcano demo-gpu-operator \
        lab-unschedulable lab-device-plugin lab-gang-deadlock lab-gang-deadlock-volcano \
        lab-queue-quota lab-mig

setup: venv bytecode fake-gpu binaries dashboard-web

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "make: error: $(PYTHON) not found; install Python 3.11+ (apt-get install python3 python3-venv)"; exit 2; }
	@echo "==> creating Python venv in $(VENV) and installing the lab (pip)"
	@$(PYTHON) -m venv $(VENV) || { echo "make: error: could not create a venv; install python3-venv (apt-get install python3-venv)"; exit 2; }
	@$(BIN)/pip install --quiet --upgrade pip
	@$(BIN)/pip install --quiet --progress-bar off -e '.[dev]'
	@touch $@

# the lab starts a Python process per component and pod: compiled once here, not in each
# (compileall writes __pycache__ even under PYTHONDONTWRITEBYTECODE; unchanged files skip)
bytecode: venv
	@$(BIN)/python -m compileall -q -j 2 -x node_modules gpulab harness demos >/dev/null

# -s: no "Nothing to be done" atop every demo; the shim's rule says when it builds
fake-gpu:
	@$(MAKE) --no-print-directory -s -C fake-gpu

binaries: venv
	@$(GPULAB) build

# upstream binaries only the e2e tests run (scheduler-plugins' kube-scheduler), cached
test-peers: venv
	@$(GPULAB) build --test-peers

# the kind backend: a Docker engine (installed and started here where none answers, as
# root on Debian/Ubuntu) and its images, pulled where a registry answers, else built here
# from Debian's packages and the Go module proxy (harness/images), cached in the engine
images: venv
	@$(GPULAB) build --images

lint: venv
	@$(BIN)/ruff check .
	@$(BIN)/ruff format --check .

# three workers: two run the e2e cluster groups, one the unit and component tests
# (tests/e2e/conftest.py pytest_xdist_make_scheduler)
test: setup test-peers images lint chromium
	@$(BIN)/pytest -ra -n 3 --dist loadgroup --durations=15

test-unit: venv fake-gpu
	@$(BIN)/pytest -ra -m "not e2e"

test-e2e: setup test-peers
	@$(BIN)/pytest -ra -m e2e

bench: setup
	@$(BIN)/python -m bench.run

demo-cluster: setup
	@$(GPULAB) demo cluster

demo-hami: setup
	@$(GPULAB) demo hami --spec hami

demo-device-plugin: setup
	@$(GPULAB) demo device-plugin

demo-kueue: setup
	@$(GPULAB) demo kueue

demo-coscheduling: setup
	@$(GPULAB) demo coscheduling --spec scheduling

demo-numa: setup
	@$(GPULAB) demo numa --spec scheduling

demo-volcano: setup
	@$(GPULAB) demo volcano --spec volcano

demo-gpu-operator: setup
	@$(GPULAB) demo gpu-operator --spec gpu-operator

# Troubleshooting labs (harness/labs, docs/workshop.md): each breaks its chapter on the
# labs cluster (--spec labs; lab-mig: --spec labs-mig; lab-gang-deadlock-volcano:
# --spec labs-volcano) and prints the symptom; then `gpulab lab hint|check|stop NAME`.
LABS := unschedulable device-plugin gang-deadlock gang-deadlock-volcano queue-quota mig

$(addprefix lab-,$(LABS)): lab-%: setup
	@$(GPULAB) lab start $*

down: venv
	@$(GPULAB) down

status: venv
	@$(GPULAB) status

# The dashboard's front end: npm packages pinned in package-lock.json, copied into the
# package (gpulab/dashboard/static/vendor), so the page loads nothing from the network.
WEB    := gpulab/dashboard/web
VENDOR := gpulab/dashboard/static/vendor

dashboard-web: $(VENDOR)/.vendored

$(VENDOR)/.vendored: $(WEB)/package.json $(WEB)/package-lock.json
	@command -v npm >/dev/null || { echo "make: error: npm not found; install Node.js 18+ and npm (apt-get install nodejs npm)"; exit 2; }
	@echo "==> vendoring the dashboard's front-end packages (npm ci)"
	@cd $(WEB) && npm ci --no-audit --no-fund --loglevel=error
	@mkdir -p $(VENDOR)
	@cp $(WEB)/node_modules/preact/dist/preact.mjs $(VENDOR)/preact.mjs
	@cp $(WEB)/node_modules/preact/hooks/dist/hooks.mjs $(VENDOR)/hooks.mjs
	@cp $(WEB)/node_modules/@preact/signals-core/dist/signals-core.mjs $(VENDOR)/signals-core.mjs
	@cp $(WEB)/node_modules/@preact/signals/dist/signals.mjs $(VENDOR)/signals.mjs
	@cp $(WEB)/node_modules/htm/dist/htm.mjs $(VENDOR)/htm.mjs
	@cp $(WEB)/node_modules/mermaid/dist/mermaid.min.js $(VENDOR)/mermaid.min.js
	@for p in preact @preact/signals @preact/signals-core htm mermaid; do \
	  cp $(WEB)/node_modules/$$p/LICENSE $(VENDOR)/$$(echo $$p | tr / -).LICENSE; done
	@touch $@

# Debian's Chromium for the dashboard's browser tests (Playwright drives it; it never
# downloads a browser of its own).
chromium:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "==> installing Debian's chromium for the browser tests (apt-get)"; \
	    apt-get install -y -qq chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }; \
	  else \
	    echo "make: error: the browser tests need Debian's chromium: sudo apt-get install chromium"; exit 2; \
	  fi; }

dashboard: setup
	@$(GPULAB) dashboard

test-dashboard: setup chromium
	@$(BIN)/pytest -ra tests/unit/test_dashboard_views.py tests/unit/test_dashboard_chain.py \
	  tests/unit/test_dashboard_hub.py \
	  tests/e2e/test_dashboard_browser.py

bench-dashboard: setup chromium
	@$(BIN)/python -m bench.run dashboard

clean:
	@$(MAKE) --no-print-directory -C fake-gpu clean
	rm -rf $(VENV) .pytest_cache .ruff_cache
