# nbdist: one place for the project's commands. See README.md.
#   make install    install-system and install-python:
#     install-system  the system packages the tests need (Chromium, sshd): root or sudo
#     install-python  nbdist editable with its test extras (builds the sidebar): no root
#   make lint       ruff format --check, ruff check, and the sidebar's prettier + eslint checks
#                   (installs the sidebar's node_modules when missing)
#   make format     rewrite what `make lint` checks: ruff format, ruff check --fix, jlpm lint
#   make test       install, lint, then the whole suite (what .ci/run runs)
#   make test-fast  the unit tests only (tests/unit), no install, no lint: run `make install` once
#   make demo       install-python, then run the quickstart notebook (no root needed)
#   make bench      the benchmarks
PYTHON ?= python3
JLPM ?= jlpm
EXT := extension
# Written by every yarn install into node_modules: the sidebar's lint tools are installed when
# it is missing or older than the manifest or the lockfile.
NODE_MODULES := $(EXT)/node_modules/.yarn-state.yml

.PHONY: install install-system install-python demo \
  lint lint-format lint-ruff lint-extension format test test-fast bench

install: install-system install-python

# Independent halves: the demo needs only the second, which needs no root.
install-system:
	bash scripts/install-system-deps.sh

# The build hook skips the front end when extension/src is unchanged: the boards (a second or
# less to build) are built again here, so an edit to board/static/ is never left unbuilt.
install-python:
	$(PYTHON) -m pip install -q -c constraints.txt -e ".[test]"
	cd $(EXT) && $(JLPM) build:boards

demo: install-python
	$(PYTHON) scripts/run_notebook.py notebooks/quickstart.ipynb

# Three independent checks: `make -k lint` reports all three even when one fails.
lint: lint-format lint-ruff lint-extension

lint-format:
	$(PYTHON) -m ruff format --check --output-format concise .

lint-ruff:
	$(PYTHON) -m ruff check .

lint-extension: $(NODE_MODULES)
	cd $(EXT) && $(JLPM) lint:check

$(NODE_MODULES): $(EXT)/package.json $(EXT)/yarn.lock
	cd $(EXT) && $(JLPM) install --immutable
	touch $@

format: $(NODE_MODULES)
	$(PYTHON) -m ruff format .
	$(PYTHON) -m ruff check --fix .
	cd $(EXT) && $(JLPM) lint

# Lint runs after install (ruff comes with the test extras) and before the suite, in that order
# even under `make -j`; -k so that a failing check still lets the others report.
test: install
	$(MAKE) --no-print-directory -k lint
	$(PYTHON) -m pytest

test-fast:
	$(PYTHON) -m pytest tests/unit

bench: install
	$(PYTHON) -m benchmarks
