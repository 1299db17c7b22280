# The two commands a newcomer needs: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test install node migrate lint typecheck check stop clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

node: install
	$(BIN)/reminders cassandra start

migrate: node
	$(BIN)/reminders migrate

# Everything the service has so far, on the local node.
run: migrate
	$(BIN)/reminders cassandra status

test: node
	$(BIN)/pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

check: lint typecheck test

stop:
	$(BIN)/reminders cassandra stop

clean: stop
	rm -rf $(VENV)
