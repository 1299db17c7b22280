# The two commands a newcomer needs: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

BUF_VERSION := 1.75.0
# The path names the version, so a new pin installs anew (as for the Go tools below).
BUF    := .cache/buf-$(BUF_VERSION)/node_modules/.bin/buf

KUSTOMIZE_VERSION := v5.8.1
KUSTOMIZE := .cache/go/kustomize-$(KUSTOMIZE_VERSION)/kustomize

# promtool checks and unit-tests the alert rules in k8s/monitoring (a long first build).
PROMTOOL_VERSION := v0.316.0
PROMTOOL := .cache/go/promtool-$(PROMTOOL_VERSION)/promtool

.PHONY: run test install constraints node migrate lint typecheck check stop clean proto buf kustomize promtool

# constraints.txt pins every package, the transitive ones too: a fresh machine installs
# what CI ran, not whatever PyPI serves that day.
# build-constraints.txt does the same for the build backend pip fetches to build this
# project (pip's build isolation does not apply -c to it).
$(STAMP): pyproject.toml constraints.txt build-constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt --build-constraint build-constraints.txt -e '.[dev]'
	touch $(STAMP)

# After a pin in pyproject.toml changes: resolve anew in a scratch venv and pin the result.
constraints:
	rm -rf .cache/constraints-venv .cache/build-venv
	$(PYTHON) -m venv .cache/constraints-venv
	.cache/constraints-venv/bin/pip install --quiet --upgrade pip
	.cache/constraints-venv/bin/pip install --quiet -e '.[dev]'
	{ sed -n '/^#/p' constraints.txt; .cache/constraints-venv/bin/pip freeze --all --exclude-editable | grep '^pip=='; \
	  .cache/constraints-venv/bin/pip freeze --exclude-editable; } > constraints.txt.new
	$(PYTHON) -m venv .cache/build-venv
	.cache/build-venv/bin/pip install --quiet $$($(PYTHON) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))') editables
	{ sed -n '/^#/p' build-constraints.txt; .cache/build-venv/bin/pip freeze; } > build-constraints.txt.new
	mv constraints.txt.new constraints.txt
	mv build-constraints.txt.new build-constraints.txt
	rm -rf .cache/constraints-venv .cache/build-venv

install: $(STAMP)

node: install
	$(BIN)/reminders cassandra start

# Runs a client of the node with what it needs to reach it (`reminders cassandra env`: the
# node's port when REMINDERS_NODE_PORT moved it and REMINDERS_CASSANDRA_PORT is unset).
# `&&`: a malformed setting stops here rather than running against another node.
NODE_CLIENT = node_env="$$($(BIN)/reminders cassandra env)" && env $$node_env

migrate: node
	$(NODE_CLIENT) $(BIN)/reminders migrate

# The whole stack in the foreground: node, API (127.0.0.1:50051), notifier, dispatcher
# (`reminders stack` starts the node, migrates and points them at it; Ctrl-C stops the
# node too when the stack started it).
run: install
	$(BIN)/reminders stack

# With REMINDERS_CASSANDRA=docker the suite starts its node in a container: no local node.
TEST_NODE := $(if $(filter docker,$(REMINDERS_CASSANDRA)),install,node)

# Two workers (pytest-xdist): most tests wait on the node, processes or the clock, not the
# CPU. worksteal: each worker starts on its half of the suite, an idle one takes half of
# the other's queue. TEST_WORKERS=0 runs in one process; so does the docker path, where
# each worker would start a Cassandra container of its own.
TEST_WORKERS ?= $(if $(filter docker,$(REMINDERS_CASSANDRA)),0,2)

# The slowest tests are listed at the end: where the suite's time (and CI's) goes.
test: $(TEST_NODE) $(BUF) $(KUSTOMIZE) $(PROMTOOL)
	$(NODE_CLIENT) $(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal --durations=20 $(PYTEST_ARGS)

# buf (the proto linter) comes from npm, pinned, into a cache inside the checkout.
$(BUF):
	mkdir -p .cache/buf-$(BUF_VERSION)
	cd .cache/buf-$(BUF_VERSION) && npm install --silent --no-audit --no-fund --no-save @bufbuild/buf@$(BUF_VERSION)

buf: $(BUF)

# kustomize (tests/k8s builds the overlays with it), pinned, built into the checkout's cache.
$(KUSTOMIZE):
	GOBIN=$(CURDIR)/$(dir $(KUSTOMIZE)) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

kustomize: $(KUSTOMIZE)

$(PROMTOOL):
	GOBIN=$(CURDIR)/$(dir $(PROMTOOL)) go install github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION)

promtool: $(PROMTOOL)

# Regenerate genproto/ from proto/ (a test fails when it is stale).
proto: install
	$(BIN)/python proto/generate.py

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

check: lint typecheck test

stop:
	$(BIN)/reminders cassandra stop

# The node is stopped only where the venv can still do it: a broken .venv is what
# `make clean` is for.
clean:
	-[ -x $(BIN)/reminders ] && $(BIN)/reminders cassandra stop
	rm -rf $(VENV)
