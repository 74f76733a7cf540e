# ledgerd: the two commands the README promises.
#   make run   installs what is missing, then runs a local cluster (ZooKeeper + bookies)
#   make test  installs what is missing, then runs the whole suite
# Both are idempotent: a second run installs nothing new.
#   make conformance  librdkafka's own test suite against the Kafka gateway (docs/kafka.md)

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ledgerd-installed
ZK_JAR := /usr/share/java/zookeeper.jar
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
BOOKIES ?= 3
KAFKA ?=

.PHONY: run test setup system-deps lint typecheck clean bench bench-deps conformance \
	conformance-deps

setup: system-deps $(STAMP)

system-deps:
	@missing=""; \
	if [ ! -f $(ZK_JAR) ]; then missing="$$missing zookeeper"; fi; \
	if ! command -v java >/dev/null 2>&1; then missing="$$missing default-jre-headless"; fi; \
	if ! $(PYTHON) -c 'import venv, ensurepip' >/dev/null 2>&1; then missing="$$missing python3-venv"; fi; \
	if ! command -v gcc >/dev/null 2>&1; then missing="$$missing gcc"; fi; \
	if [ ! -f /usr/include/openssl/ssl.h ]; then missing="$$missing libssl-dev"; fi; \
	if ! command -v kcat >/dev/null 2>&1; then missing="$$missing kcat"; fi; \
	if ! command -v npm >/dev/null 2>&1; then missing="$$missing npm"; fi; \
	if ! $(PYTHON) -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then \
		missing="$$missing python3-dev"; fi; \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:$$missing"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing \
			</dev/null || exit 1; \
	fi

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(VENV)/bin/python pyproject.toml constraints.txt setup.py native/_build.py \
		native/_tls_build.py
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev,spark]'
	$(PY) -c 'import ledgerd.native._native' || { echo "native helper failed to build (needs gcc and python3-dev)" >&2; exit 1; }
	touch $(STAMP)

run: setup
	$(VENV)/bin/ledgerd local --bookies $(BOOKIES) $(if $(KAFKA),--kafka $(KAFKA))

lint: setup
	$(VENV)/bin/ruff check .

typecheck: setup
	$(VENV)/bin/mypy --no-error-summary --exclude "ledgerd/tools/(?!bookieprocess|processcluster|localcluster|audit|replication_cmds|storage_cmds|faults)" ledgerd

# KafkaJS for tests/kafka/test_kafkajs.py, from npm, pinned by its lock file's sha512.
KAFKAJS := tests/kafka/kafkajs
$(KAFKAJS)/node_modules/.package-lock.json: $(KAFKAJS)/package.json $(KAFKAJS)/package-lock.json
	cd $(KAFKAJS) && npm ci --no-audit --no-fund --loglevel=error </dev/null

# Two workers, whole files to each (module fixtures stay on one worker): most of the
# suite waits on processes, fsyncs and timeouts, so two cores run it in about half the
# time. TEST_WORKERS=0 runs it in this one process (pytest's own -n 0).
TEST_WORKERS ?= 2
test: setup lint typecheck $(KAFKAJS)/node_modules/.package-lock.json
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) build *.egg-info native/_native*.so native/_native.c native/ledgerd tests/kafka/kafkajs/node_modules

# librdkafka's own test suite against a real `ledgerd local --kafka` cluster (not part of
# `make test`; CI runs it after). The librdkafka release is the one the expectations list
# names; its source comes from a package registry, pinned, and its test-runner is built
# once under build/ (a second run builds nothing). CONFORMANCE_MODE=full runs the
# test-runner without -Q; CONFORMANCE_TESTS=0001,0081 runs only those test numbers.
CONFORMANCE_LIST := tests/conformance/librdkafka.toml
LIBRDKAFKA_VERSION := $(shell sed -n 's/^librdkafka = "\(.*\)"$$/\1/p' $(CONFORMANCE_LIST))
LIBRDKAFKA := build/librdkafka-$(LIBRDKAFKA_VERSION)
CONFORMANCE_MODE ?= quick
CONFORMANCE_JOBS ?= 2
CONFORMANCE_TESTS ?=
CONFORMANCE_PACKAGES := g++ pkg-config zlib1g-dev libzstd-dev libssl-dev rapidjson-dev

conformance-deps:
	@missing=""; \
	for p in $(CONFORMANCE_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if ! command -v npm >/dev/null 2>&1; then missing="$$missing npm"; fi; \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:$$missing"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing \
			</dev/null || exit 1; \
	fi

$(LIBRDKAFKA)/tests/test-runner: tests/conformance/build-librdkafka.sh
	bash tests/conformance/build-librdkafka.sh $(LIBRDKAFKA_VERSION) $(LIBRDKAFKA) </dev/null

conformance: setup conformance-deps $(LIBRDKAFKA)/tests/test-runner
	$(PY) -m tests.conformance.runner --mode $(CONFORMANCE_MODE) --jobs $(CONFORMANCE_JOBS) \
		$(if $(CONFORMANCE_TESTS),--tests $(CONFORMANCE_TESTS))

# Benchmarks (not part of `make test`): Redis is the side-by-side anchor for bench/bookie.py
# and bench/latency.py (driven there by bench/adddriver.c, built with setup's gcc).
bench-deps: setup
	@if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-benchmark >/dev/null 2>&1; then \
		echo "installing system packages: redis-server redis-tools"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			redis-server redis-tools </dev/null || exit 1; \
	fi
	@$(PY) -c 'import rocksdict' 2>/dev/null || $(VENV)/bin/pip install -q -c constraints.txt 'rocksdict>=0.3,<1'

bench: bench-deps
	$(PY) bench/wire_codec.py
	$(PY) bench/journal.py
	$(PY) bench/metadata.py
	$(PY) bench/bookie.py
	$(PY) bench/client.py
