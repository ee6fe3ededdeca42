# multusd developer entry points. `make run` and `make test` work from a clean clone on a
# fresh Debian 12 machine, as root. See README.md.

VENV    := .venv
PYTHON  := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: all setup run test bench packages clean

all: test

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/install-deps
	./scripts/install-deps
	/usr/bin/python3 -m venv --system-site-packages $(VENV)
	$(PYTHON) -m pip install --quiet --no-deps --no-build-isolation --no-index -e .
	touch $@

run: setup
	$(PYTHON) scripts/demo.py

test: setup
	$(PYTHON) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) tests

bench: setup
	$(PYTHON) bench/bench.py

clean:
	rm -rf $(VENV) build dist *.egg-info
