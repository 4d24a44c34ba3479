# The two commands a newcomer needs: `make up` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# what `pip install -e` builds from: a change to any of these reinstalls (setup.py compiles the
# record check and the JSON header codec in place)
BUILD_INPUTS := pyproject.toml setup.py broker/store/_record_check.c common/remoting/_json_header.c
STAMP := $(VENV)/.installed-$(shell cat $(BUILD_INPUTS) | cksum | cut -d' ' -f1)

.PHONY: up test lint install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python $(BUILD_INPUTS)
	$(BIN)/pip install -q -e '.[test,spark]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install: $(STAMP)

up: install
	$(BIN)/rmq up $(ARGS)

# Every check can fail the build: lint, format, types, then the suite.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Test files run on parallel workers, each file whole on one worker (its module fixtures start
# once); the 25 slowest tests are printed at the end of every run.
WORKERS ?= 3
test: lint
	$(BIN)/pytest -n $(WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .rmq .pytest_cache build broker/store/_record_check.*.so \
		common/remoting/_json_header.*.so
