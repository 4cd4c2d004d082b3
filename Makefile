# The two commands of the README: `make demo` and `make test`. Both create the environment first.
VENV ?= .venv
PY := $(VENV)/bin/python
# On these machines torch==2.13.0 resolves to the CPU wheel on local disk; elsewhere point this at a
# CPU build (e.g. TORCH_SPEC="torch --index-url <your CPU wheel index>") to avoid a multi-GB CUDA wheel.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# One pytest run over both folders on three pytest-xdist workers, a test file per worker at a time: the
# real-process jobs spend much of their time waiting (rendezvous, timeouts), and the in-process tests
# fill those gaps (the suite is CPU-bound on 2 cores; docs/testing.md).
XDIST ?= -n 3 --dist loadfile

.PHONY: setup setup-ray demo test test-slow test-ray bench slurm-cluster clean

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
	$(VENV)/bin/pytest -q $(XDIST) tests/unit tests/multiproc $(PYTEST_ARGS)

# The long runs: fuzz campaigns and large worlds (marked slow; `make test` leaves them out).
test-slow: setup
	$(VENV)/bin/pytest -q $(XDIST) -m slow tests/unit tests/multiproc $(PYTEST_ARGS); s=$$?; \
	[ $$s -eq 0 ] || [ $$s -eq 5 ]

# ringlet.ray and Ray Train (tests/ray_jobs): the `ray` extra, then its tests on a local Ray instance. Kept out of
# `make test`: Ray's start-up and the Ray Train runs take minutes (docs/ray.md).
setup-ray: setup
	scripts/install-ray.sh $(VENV)

test-ray: setup-ray
	$(VENV)/bin/pytest -q tests/ray_jobs $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/ringlet run -np 4 -- $(PY) benchmarks/allreduce_one_host/allreduce_bench.py

# A real Slurm (slurm-wlm, munge) on the emulated hosts, srun and salloc runs of the examples; needs root
# and the machine to itself for about 8 minutes (benchmarks/slurm/README.md).
slurm-cluster: setup
	PY=$(abspath $(PY)) flock /tmp/ringlet-cluster.lock benchmarks/slurm/slurm_cluster.sh

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
