# The two set-up commands of the README: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test lint typecheck unit bench clean conformance

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/bastion serve $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) lint typecheck
	tests/conformance/install.sh
	test -d tests/e2e/ts_client/node_modules || tests/e2e/ts_client/install.sh
	BASTION_NODE_REQUIRED=1 $(BIN)/pytest -q -p no:cacheprovider
	$(MAKE) conformance

# The official MCP conformance suite, direct vs through Bastion (tests/conformance/run.py).
conformance: $(STAMP)
	tests/conformance/install.sh
	$(BIN)/python -m tests.conformance.run

bench: $(STAMP)
	$(BIN)/python bench/table.py $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .conformance
