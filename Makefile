# nbdist: one place for the project's commands. See README.md.
#   make install    install-system and install-python:
#     install-system  the system packages the tests need (Chromium, sshd): root or sudo
#     install-python  nbdist editable with its test and docs extras (builds the sidebar): no root
#   make lint       ruff format --check, ruff check, and the sidebar's prettier + eslint checks
#                   (installs the sidebar's node_modules when missing)
#   make format     rewrite what `make lint` checks: ruff format, ruff check --fix, jlpm lint
#   make test       install, lint, then the whole suite (what .ci/run runs)
#   make test-fast  the unit tests only (tests/unit), no install, no lint: run `make install` once
#   make demo       nbdist with JupyterLab and what the quickstart needs (not the test and docs
#                   extras), then run the quickstart notebook (no root needed)
#   make bench      the benchmarks
#   make docs       build the docs site into docs/_build/html and open it (no install: run
#                   `make install-python` once; `make test` builds it too, warnings as errors)
PYTHON ?= python3
JLPM ?= jlpm
EXT := extension
# Written by every yarn install into node_modules: the sidebar's lint tools are installed when
# it is missing or older than the manifest or the lockfile.
NODE_MODULES := $(EXT)/node_modules/.yarn-state.yml

.PHONY: install install-system install-python demo \
  lint lint-format lint-ruff lint-extension format test test-fast bench docs

install: install-system install-python

# Independent halves; the demo needs neither (it installs only what it runs, without root).
install-system:
	bash scripts/install-system-deps.sh

# The build hook skips the front end when nothing in extension/src (the boards' sources too) is
# newer than nbdist/labextension: the boards (a second or less to build) are built again here
# all the same, so a removed board/static/built/ is never left unbuilt.
install-python:
	$(PYTHON) -m pip install -q -c constraints.txt -e ".[test,docs]"
	cd $(EXT) && $(JLPM) build:boards

demo:
	$(PYTHON) -m pip install -q -c constraints.txt -e ".[lab,demo]"
	cd $(EXT) && $(JLPM) build:boards
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

# Shows the executed notebooks and the screenshots of the last test run where there was one
# (test-artifacts/). No network: nothing is fetched, nothing executed. Warnings are shown, not
# fatal here (tests/unit/test_docs.py makes them errors). Opened where there is a display;
# otherwise the path to open is printed.
docs:
	$(PYTHON) -m sphinx -q -b html docs docs/_build/html
	@$(PYTHON) -c "$$OPEN_DOCS"

define OPEN_DOCS
import os, pathlib, sys, webbrowser
page = pathlib.Path("docs/_build/html/index.html").resolve()
print(page)
if sys.platform in ("darwin", "win32") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
    webbrowser.open(page.as_uri())
endef
export OPEN_DOCS
