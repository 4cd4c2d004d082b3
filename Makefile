# The two commands of the README: `make demo` and `make test`. Both create the environment first.
VENV ?= .venv
PY := $(VENV)/bin/python
# On these machines torch==2.13.0 resolves to the CPU wheel on local disk; elsewhere point this at a
# CPU build (e.g. TORCH_SPEC="torch --index-url <your CPU wheel index>") to avoid a multi-GB CUDA wheel.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# The in-process tests run on two pytest-xdist workers (each holds one core: its ranks are threads);
# the real-process tests run one job at a time (a job's ranks keep the cores busy themselves). Both
# halves always run; the target fails if either failed (exit 5, nothing selected, is no failure).
XDIST ?= -n 2

.PHONY: setup demo test test-slow bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[mpi,test,examples]'
	touch $@

demo: setup
	$(VENV)/bin/ringlet demo

test: setup
	$(VENV)/bin/pytest -q $(XDIST) tests/unit $(PYTEST_ARGS); u=$$?; \
	$(VENV)/bin/pytest -q tests/multiproc $(PYTEST_ARGS); m=$$?; \
	for s in $$u $$m; do [ $$s -eq 0 ] || [ $$s -eq 5 ] || exit 1; done

# The long fuzz runs (marked slow; `make test` leaves them out).
test-slow: setup
	$(VENV)/bin/pytest -q $(XDIST) -m slow tests/unit $(PYTEST_ARGS); u=$$?; \
	$(VENV)/bin/pytest -q -m slow tests/multiproc $(PYTEST_ARGS); m=$$?; \
	for s in $$u $$m; do [ $$s -eq 0 ] || [ $$s -eq 5 ] || exit 1; done

bench: setup
	$(VENV)/bin/ringlet run -np 4 -- $(PY) benchmarks/allreduce_one_host/allreduce_bench.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
