# Entry points. Every target bootstraps .venv and the generated gRPC code itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
PROTOS := $(sort $(wildcard proto/mqstore/v1/*.proto))
# RocketMQ 5's gRPC protocol, vendored from apache/rocketmq-apis (docs/rocketmq5.md).
RMQ5_PROTOS := $(sort $(wildcard proto/apache/rocketmq/v2/*.proto))
GENERATED := gen/.generated
STORE ?= ./data
PYTEST_ARGS ?=

.PHONY: setup proto run test lint bench clean java

setup: $(GENERATED)

$(INSTALLED): requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	touch $@

# Generated code is never edited by hand: it is rebuilt from proto/ whenever a .proto changes.
$(GENERATED): $(INSTALLED) $(PROTOS) $(RMQ5_PROTOS) pyproject.toml
	rm -rf gen && mkdir -p gen
	$(PY) -m grpc_tools.protoc -Iproto --python_out=gen --pyi_out=gen --grpc_python_out=gen $(PROTOS) $(RMQ5_PROTOS)
	touch gen/mqstore/__init__.py gen/mqstore/v1/__init__.py
	touch gen/apache/__init__.py gen/apache/rocketmq/__init__.py gen/apache/rocketmq/v2/__init__.py
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

proto:
	rm -f $(GENERATED)
	$(MAKE) $(GENERATED)

run: $(GENERATED)
	$(VENV)/bin/mqstore up --store $(STORE)

test: $(GENERATED) java node-deps
	$(PY) -m pytest $(PYTEST_ARGS)

# The Spark pipeline's tests need a Java 17 runtime; a fresh machine (CI) gets Debian's.
java:
	@command -v java >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }

# The Node.js client's dependencies (clients/node), exactly as package-lock.json pins them.
NODE_DEPS := clients/node/node_modules/.package-lock.json

.PHONY: node-deps
node-deps: $(NODE_DEPS)

$(NODE_DEPS): clients/node/package-lock.json clients/node/package.json
	@command -v npm >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq nodejs npm >/dev/null; }
	npm ci --prefix clients/node --no-audit --no-fund
	touch $@

lint: $(GENERATED)
	$(VENV)/bin/ruff check services gateway pipeline mqstore_client tests bench
	$(VENV)/bin/mypy services gateway pipeline mqstore_client
	$(VENV)/bin/lint-imports

bench: $(GENERATED)
	$(PY) -m bench.append_engine
	$(PY) -m bench.append_grpc
	$(PY) -m bench.sync_flush
	$(PY) -m bench.dispatch
	$(PY) -m bench.query
	$(PY) -m bench.gateway
	$(PY) -m bench.scheduler_lateness
	$(PY) -m bench.recovery

# mqstore side by side with Redis Streams and NATS JetStream (issue 10; bench/peers.py): installs
# Debian's redis-server and nats-server when absent and the peers' Python clients (bench/requirements-peers.txt,
# into .venv only), starts private servers on loopback, prints one table. PEERS_ARGS="--quick" for a smoke run.
PEERS_ARGS ?=
.PHONY: bench-peers
bench-peers: $(GENERATED)
	$(PY) -m pip install --quiet --disable-pip-version-check -r bench/requirements-peers.txt
	$(PY) -m bench.peers $(PEERS_ARGS)

# The long differential soak (not in CI; tests/soak/soak.py): kill -9 of every service while producing,
# then every index and export compared with every other. SOAK_MINUTES=60, SOAK_GEOMETRY=default (or small,
# or CL_BYTES,CQ_UNITS,SLOTS,ENTRIES), SOAK_SEED=N repeats a run's random choices.
.PHONY: soak
soak: $(GENERATED) java
	$(PY) -m tests.soak.soak

# Memory over a long run (not in CI; bench/memory_soak.py): mqstore up under 64 clients for
# SOAK_MEMORY_MINUTES, every service's RSS sampled into .bench-tmp/memory-soak.csv, a verdict per service.
SOAK_MEMORY_MINUTES ?= 30
.PHONY: soak-memory
soak-memory: $(GENERATED)
	$(PY) -m bench.memory_soak --minutes $(SOAK_MEMORY_MINUTES)

clean:
	rm -rf $(VENV) gen build *.egg-info
