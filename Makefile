# The two set-up commands of the README, plus benchmarks. Each installs what it needs.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

# Tests run in parallel processes, one per core up to 4 (each test starts its own redis-server,
# devservers and workers on free ports); worksteal keeps every process busy when a long test comes last.
# `make test PYTEST_PARALLEL=-n0` runs them one at a time.
PYTEST_PARALLEL ?= -n auto --maxprocesses 4 --dist worksteal

.PHONY: demo test bench redis-server clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $@

# redis-server must be on the machine: the demo and the tests start private instances.
redis-server:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && apt-get install -y -q redis-server; \
	  else echo "install redis-server (e.g. sudo apt-get install redis-server, brew install redis)"; exit 1; fi; }

demo: $(VENV)/.installed redis-server
	$(BIN)/eagle-synth demo

test: $(VENV)/.installed redis-server
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)

bench: $(VENV)/.installed redis-server
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) demo-run .pytest_cache
