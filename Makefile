# Two commands do all set-up on a fresh machine with only Python installed:
#   make demo   -- creates .venv if missing, runs NMF on a local cluster
#   make test   -- creates .venv if missing, runs the test suite
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: demo test test-all test-deploy bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,torch,deploy]'
	$(PY) -m harmony.kernels.warm    # numba: compile the apps' kernels into its cache now
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/harmony demo

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q

test-all: $(STAMP)
	$(PY) -m pytest -q

# T2 of the deploy tests (root): site.yml converges a systemd-nspawn fleet of
# this machine and runs a 2-machine job on it (tests/deploy/test_deploy_t2.py).
test-deploy: $(STAMP)
	PYTHONPATH=. $(PY) -m pytest -m deploy_t2 -q -s tests/deploy/test_deploy_t2.py

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/ps_throughput.py --reps 60
	$(PY) bench/nmf_epoch.py
	$(PY) bench/colocation.py
	$(PY) bench/store_alpha.py

clean:
	rm -rf $(VENV) build *.egg-info
