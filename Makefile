# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-slow bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned to the local CPU wheel: a bare requirement pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,trl,ray]'
	touch $(STAMP)

# The main job on the built-in default: the profile procedure on the tiny model (~10 min).
demo: setup
	$(BIN)/rlbatch model build
	$(BIN)/rlbatch profile --preset quick --out profiles/quick

test: setup
	$(BIN)/python -m pytest

test-slow: setup
	$(BIN)/python -m pytest -m slow

bench: setup
	$(BIN)/python bench/run_all.py

lint: setup
	$(BIN)/ruff check src tests bench

clean:
	rm -rf $(VENV) .pytest_cache .rlbatch-cache
