# nbdist: one place for the project's commands. See README.md.
PYTHON ?= python3

.PHONY: install demo test bench

install:
	bash scripts/install-system-deps.sh
	$(PYTHON) -m pip install -q -c constraints.txt -e ".[test]"

demo: install
	$(PYTHON) scripts/run_notebook.py notebooks/quickstart.ipynb

test: install
	$(PYTHON) -m pytest

bench: install
	$(PYTHON) -m benchmarks
