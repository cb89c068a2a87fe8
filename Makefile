# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo demo-saving test test-slow bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned to the local CPU wheel: a bare requirement pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,trl,ray]'
	# verl's Hydra config and validate_config, OpenRLHF's argument parser and checks, and the
	# pure-Python modules their config code imports, only to check the commands rlbatch runs
	# against them (tests/test_framework_keys.py, tests/test_walkthroughs.py). --no-deps, so
	# none can replace torch or pull a GPU stack.
	$(BIN)/python -m pip install -q --no-deps verl==0.9.1 openrlhf==0.11.2 tensordict==0.15.3 \
		pyvers==0.2.3 codetiming==1.4.0 orjson==3.13.0 pylatexenc==2.11
	touch $(STAMP)

# The main job on the built-in default: the profile's default decision on the tiny model
# (11 min on this project's 2-core machine with the model cached, at most 16 baseline runs'
# training time; README, "What the demo prints").
demo: setup
	$(BIN)/rlbatch model build
	$(BIN)/rlbatch profile --preset quick --out profiles/quick

# The demo's second half: a workload where a larger batch saves time (the quick workload
# behind 0.25 s of rollout latency per step, B0 = 64), the same default decision: at most
# 16 baseline runs' training time, each about a minute on 2 cores (docs/analysis.md,
# "Replays").
demo-saving: setup
	$(BIN)/rlbatch model build
	$(BIN)/rlbatch profile --preset quick-saving --out profiles/quick-saving

# Two workers, one test file each at a time (module fixtures are built once), in the order
# tests/conftest.py gives the files: a serial run spends much of its time waiting on
# subprocesses and leaves a core idle.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-slow: setup
	$(BIN)/python -m pytest -m slow -n $(TEST_WORKERS) --dist loadfile

bench: setup
	$(BIN)/python bench/run_all.py

lint: setup
	$(BIN)/ruff check src tests bench

# Wheels the GPU machine lacks (it has no network): pydantic and its dependencies for CPython
# 3.12 on x86-64 Linux, pinned to this venv's pydantic, plus setuptools, wheel and packaging
# for the editable install of rlbatch. wheels/ is git-ignored by its own .gitignore; carry
# it with `carry: ["wheels/gpu"]` (docs/benchmarks.md, "GPU check (H200)").
.PHONY: gpu-wheels
gpu-wheels: setup
	rm -rf wheels/gpu
	mkdir -p wheels/gpu
	printf '*\n' > wheels/.gitignore
	$(BIN)/python -m pip download -q --only-binary=:all: --python-version 3.12 \
	  --implementation cp --abi cp312 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -d wheels/gpu \
	  "pydantic==$$($(BIN)/python -c 'import pydantic; print(pydantic.VERSION)')"
	$(BIN)/python -m pip download -q --only-binary=:all: --python-version 3.12 \
	  --implementation cp --abi cp312 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -d wheels/gpu "setuptools>=77" wheel
	ls wheels/gpu
	du -sh wheels/gpu

# What set-up, the demos and the tests made: the virtual environment, the demos' profiles,
# the tests' model cache (.rlbatch-cache) and the models the demos built under
# $RLBATCH_CACHE (by default ~/.cache/rlbatch; rebuilt in about a minute).
clean:
	rm -rf $(VENV) .pytest_cache .rlbatch-cache wheels profiles/quick profiles/quick-saving
	rm -rf "$${RLBATCH_CACHE:-$$HOME/.cache/rlbatch}/models"
