# The two commands a newcomer runs: `make demo` and `make test`.
# Both create (or reuse) .venv and install the project into it: `make demo` (and `make install`)
# only what a swarm needs to run, `make test` (and `make install-dev`) the test extras on top.
PYTHON        ?= python3
VENV          ?= .venv
TORCH_VERSION ?= 2.13.0
PY            := $(VENV)/bin/python
STAMP         := $(VENV)/.swarmloco-installed
DEV_STAMP     := $(VENV)/.swarmloco-dev-installed
DEMO_ARGS     ?=
PYTEST_ARGS   ?=
TEST_WORKERS  ?= 2

.PHONY: install install-dev demo test proto clean

install: $(STAMP)

install-dev: $(DEV_STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# A CPU build of torch when none is importable: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==$(TORCH_VERSION)"
	$(PY) -m pip install -q -e .
	touch $(STAMP)

# The test extras (pyproject.toml [dev]: pytest, hypothesis, transformers, matplotlib, grpcio-tools, pyarrow).
$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[dev]"
	touch $(DEV_STAMP)

demo: $(STAMP)
	$(VENV)/bin/swarmloco demo $(DEMO_ARGS)

# Bytecode for the project's own modules first: where PYTHONDONTWRITEBYTECODE is set (as on this
# project's machines) every process the tests start would compile them again (~0.15 CPU-s each).
test: $(DEV_STAMP)
	$(PY) -m compileall -q peer protocol optim scripts tests > /dev/null
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

# Regenerate protocol/_generated from proto/swarm.proto (tests fail when it is stale; needs grpcio-tools).
proto: $(DEV_STAMP)
	$(PY) -m protocol.codegen

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
