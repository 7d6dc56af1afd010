# The two commands a newcomer runs: `make demo` and `make test`.
# Both create (or reuse) .venv and install the project into it.
PYTHON        ?= python3
VENV          ?= .venv
TORCH_VERSION ?= 2.13.0
PY            := $(VENV)/bin/python
STAMP         := $(VENV)/.swarmloco-installed
DEMO_ARGS     ?=
PYTEST_ARGS   ?=
TEST_WORKERS  ?= 2

.PHONY: install demo test proto bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# A CPU build of torch when none is importable: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==$(TORCH_VERSION)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/swarmloco demo $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

# Regenerate protocol/_generated from proto/swarm.proto (tests fail when it is stale).
proto: $(STAMP)
	$(PY) -m protocol.codegen

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
