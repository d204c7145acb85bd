# Two commands a user needs: `make demo` and `make test`. Both build/refresh .venv first.
# The suite runs one worker more than the cores, up to 4 (pytest-xdist): most of its time
# is child processes and disk and deadline waits (2 workers on 2 cores: ~20 % idle), so
# two workers on 2 cores take ~0.6x the time of one, three 0.93x the time of two.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
WORKERS := $(shell $(PYTHON) -c "import os; n = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count(); print(min(4, (n or 1) + 1))" 2>/dev/null || echo 2)

.PHONY: venv compile demo test test-matrix format typecheck bench bench-gpu clean

venv: $(STAMP)

# Azurite, the Azure Blob emulator that tests/remote/test_azure.py starts, is an npm
# package: installed with the machine's npm into .venv/azurite (without npm those tests
# are skipped, naming why), beside pip's install: each mostly waits on downloads.
AZURITE := azurite@3.37.0

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if command -v npm >/dev/null 2>&1; then \
	  npm install --silent --no-audit --no-fund --prefix $(VENV)/azurite $(AZURITE) & npm_pid=$$!; \
	else echo "no npm on this machine: the az:// tests will be skipped"; npm_pid=; fi; \
	$(PY) -m pip install --quiet --upgrade pip && $(PY) -m pip install --quiet -e '.[dev]'; pip_status=$$?; \
	if [ -n "$$npm_pid" ] && ! wait $$npm_pid; then \
	  echo "npm could not install $(AZURITE): the az:// tests will be skipped"; fi; \
	exit $$pip_status
	touch $(STAMP)

demo: venv
	$(PY) -m asupervisor demo --logdir runs/demo

# The package's bytecode, written once: with PYTHONDONTWRITEBYTECODE set (some CI images
# and sandboxes) every child process of the suite and every bench run would compile it
# from source again (0.24 s a process here, a tenth of a start).
compile: venv
	$(PY) -m compileall -q asupervisor

test: venv compile
	$(PY) -X importtime -c "import asupervisor" 2> .importtime.log; \
	  if grep -q tensorflow .importtime.log; then echo "importing asupervisor imported tensorflow"; rm -f .importtime.log; exit 1; fi; rm -f .importtime.log
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest -q -n $(WORKERS) --dist worksteal

# Not part of `make test`: the suite on the oldest and newest TensorFlow/Keras/Python the
# project claims (pyproject.toml, README), each in its own venv under .venv-matrix/ (two
# TensorFlow downloads; the whole suite twice). PYTHON_OLDEST / PYTHON_NEWEST name the
# interpreters (default python3.10 / python3.13 on PATH); see tools/test_matrix.sh.
test-matrix:
	tools/test_matrix.sh

# The formatter `make test` checks (ruff format), and the import order, in place.
format: venv
	$(PY) -m ruff check --select I --fix .
	$(PY) -m ruff format .

bench: venv compile
	$(PY) bench/step_overhead.py
	$(PY) bench/hooks_overhead.py
	$(PY) bench/hooks_overhead.py --backend trio
	$(PY) bench/checkpoint.py
	$(PY) bench/overhead_budget.py --secs 60 --rounds 2
	$(PY) bench/native_writer.py
	$(PY) bench/queue_runner.py
	$(PY) bench/queue_runner.py --backend trio
	$(PY) bench/embed_latency.py
	$(PY) bench/embed_latency.py --backend trio
	$(PY) bench/remote.py
	$(PY) bench/keras_fit.py

# The GPU path (bench/gpu.py): on a machine without a GPU it says so and exits 0.
bench-gpu: venv
	$(PY) bench/gpu.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache
