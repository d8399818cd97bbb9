# distfusion: `make run` runs TPC-H Q5 distributed on Spark (embedded) at scale factor 1; `make test` runs the tests.
# Both work on a fresh machine with Python 3.11 and Java 17: they create .venv and install.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
SF1 := data/tpch-sf1
PYTEST_ARGS ?=

.PHONY: run lint test test-slow test-all fuzz bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[spark,datagen]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[spark,datagen,test]'
	touch $@

$(SF1)/.complete: | $(VENV)/.installed-run
	$(BIN)/distfusion datagen tpch --scale 1 --out $(SF1) --parts 8
	touch $@

run: $(VENV)/.installed-run $(SF1)/.complete
	$(BIN)/distfusion query --file src/distfusion/tpch/queries/q5.sql --tpch $(SF1) --explain --runtime spark --in-place-bytes 0

lint: $(VENV)/.installed-test
	$(BIN)/ruff check src tests
	$(BIN)/mypy

# The default run skips the suites marked slow (the 97 other TPC-DS queries in Spark's
# dialect, Spark's SQL test inputs, the fuzzer's long profile, a standalone cluster, ...);
# `make test-slow` runs those, `make test-all` both; CI (.ci/run) runs test and test-slow.
test: lint
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

test-all: lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The randomized differential fuzzer: 2,000 queries on the local runtime and a
# sample on Flight and Spark (tests/fuzz_sql.py; DISTFUSION_FUZZ_QUERIES=N and
# DISTFUSION_FUZZ_SAMPLE_QUERIES=N for more).
fuzz: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m slow tests/test_fuzz.py $(PYTEST_ARGS)

bench: $(VENV)/.installed-run $(SF1)/.complete
	$(BIN)/distfusion bench tpch --data $(SF1) --runtime spark --workers 2

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
