# The two commands of the README, plus the pieces they are made of.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/.tools/bin:$(PATH)

.PHONY: setup demo test lint bench chart images images-lock

setup:
	bash scripts/setup.sh

## make demo: the operator flow in the lab (API emulator, controller, lab kubelet, remote sites), until Ctrl-C (docs/demo.md)
demo: setup
	$(PY) -m lab demo

## make test: quality gates, then every test tier (lab tests need root; CI runs as root), in TEST_WORKERS
## processes (pytest-xdist; a file's tests stay together in one); TEST_WORKERS=0 runs them in this one
TEST_WORKERS ?= 3
test: setup lint
	$(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

## make bench: every benchmark in bench/ (root: most run live daemons); numbers go to docs/
bench: setup
	set -e; for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b; done

## make chart: regenerate the chart's generated copies (CRDs from the controller, monitoring files)
chart:
	$(PY) -m controller chart helm/vpngw
	cp monitoring/alerts.yml helm/vpngw/files/alerts.yml
	cp monitoring/grafana-dashboard.json helm/vpngw/files/grafana-dashboard.json

## make images: the gateway and controller images, built locally (no registry) into out/*.oci.tar
images: setup
	bash images/build.sh

## make images-lock: rebuild and rewrite the images' package locks (review the diff)
images-lock: setup
	bash images/build.sh --update-lock
