# Entry points. Every target bootstraps .venv and the generated gRPC code itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
PROTOS := $(sort $(wildcard proto/mqstore/v1/*.proto))
# RocketMQ 5's gRPC protocol, vendored from apache/rocketmq-apis (docs/rocketmq5.md).
RMQ5_PROTOS := $(sort $(wildcard proto/apache/rocketmq/v2/*.proto))
# etcd's v3 gRPC API (KV, Lease), vendored from etcd-io/etcd (proto/etcd/LICENSE): replica leadership
# (docs/replication.md). Generated as the top-level package etcd.api.*.
ETCD_PROTOS := $(sort $(wildcard proto/etcd/api/*/*.proto))
GENERATED := gen/.generated
STORE ?= ./data
PYTEST_ARGS ?=

.PHONY: setup proto run test lint bench clean java dist

setup: $(GENERATED)

$(INSTALLED): requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	touch $@

# Generated code is never edited by hand: it is rebuilt from proto/ whenever a .proto changes, by the one
# recipe the image build also runs (proto/generate.sh). The venv finds every module by path: the editable
# install puts the repository root on sys.path (a plain .pth, no import hooks) and mqstore-gen.pth adds gen/,
# so services.store.formats.record is services/store/formats/record.py and mqstore.v1 is gen/mqstore/v1.
$(GENERATED): $(INSTALLED) $(PROTOS) $(RMQ5_PROTOS) $(ETCD_PROTOS) proto/generate.sh pyproject.toml
	proto/generate.sh $(PY) gen
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
		--config-settings editable_mode=compat -e .
	$(PY) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'mqstore-gen.pth').write_text('$(CURDIR)/gen\n')"
	touch $@

proto:
	rm -f $(GENERATED)
	$(MAKE) $(GENERATED)

run: $(GENERATED)
	$(VENV)/bin/mqstore up --store $(STORE)

test: $(GENERATED) java node-deps powercut-deps promtool etcd
	$(PY) -m pytest $(PYTEST_ARGS)

# Replica leadership (services/commitlog/ha/, docs/replication.md) keeps its leases, epochs and in-sync
# sets in etcd; the tests start Debian's etcd-server on dynamic ports.
.PHONY: etcd
etcd:
	@command -v etcd >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq etcd-server >/dev/null; }

# The Spark pipeline's tests need a Java 17 runtime; a fresh machine (CI) gets Debian's.
java:
	@command -v java >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }

# promtool validates and unit-tests the Prometheus alerting rules (deploy/prometheus,
# tests/observability/test_alert_rules.py); Debian's prometheus package provides it.
.PHONY: promtool
promtool:
	@command -v promtool >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq prometheus >/dev/null; }

# The Node.js client's dependencies (clients/node), exactly as package-lock.json pins them.
NODE_DEPS := clients/node/node_modules/.package-lock.json

.PHONY: node-deps
node-deps: $(NODE_DEPS)

$(NODE_DEPS): clients/node/package-lock.json clients/node/package.json
	@command -v npm >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq nodejs npm >/dev/null; }
	npm ci --prefix clients/node --no-audit --no-fund
	touch $@

# The power-cut tests' FUSE file system (tests/powercut/): Debian's fuse3 (fusermount3, libfuse3) and
# the ctypes binding mfusepy (tests/powercut/requirements.txt, into .venv only: not a server dependency).
POWERCUT_DEPS := $(VENV)/.powercut-deps

.PHONY: powercut-deps
powercut-deps: $(POWERCUT_DEPS)

$(POWERCUT_DEPS): tests/powercut/requirements.txt $(INSTALLED)
	@command -v fusermount3 >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq fuse3 >/dev/null; }
	$(PY) -m pip install --quiet --disable-pip-version-check -r tests/powercut/requirements.txt
	touch $@

# The long power-cut campaigns (not in CI; tests/powercut/): the commitlog service on a FUSE file system
# that forgets everything not made durable, cut SOAK_POWER_CUTS times under SYNC_FLUSH (campaign.py;
# SOAK_POWER_MODE=torn tears unsynced writes at a random sector instead of dropping them); the store's
# services behind a running gateway, cut SOAK_POWER_GATEWAY_CUTS times, every kind of state checked
# (gateway_campaign.py; make test runs 50); the whole of `mqstore up`, cut SOAK_POWER_UP_CUTS times
# (up_campaign.py); and ASYNC_FLUSH's loss window measured against the flush interval (campaign.py).
SOAK_POWER_CUTS ?= 500
SOAK_POWER_MODE ?= drop
SOAK_POWER_GATEWAY_CUTS ?= 300
SOAK_POWER_UP_CUTS ?= 50
SOAK_POWER_ASYNC_CUTS ?= 50
.PHONY: soak-power
soak-power: $(GENERATED) powercut-deps
	$(PY) -m tests.powercut.campaign --cuts $(SOAK_POWER_CUTS) --mode $(SOAK_POWER_MODE)
	$(PY) -m tests.powercut.gateway_campaign --cuts $(SOAK_POWER_GATEWAY_CUTS)
	$(PY) -m tests.powercut.up_campaign --cuts $(SOAK_POWER_UP_CUTS)
	$(PY) -m tests.powercut.campaign --cuts $(SOAK_POWER_ASYNC_CUTS) --flush ASYNC_FLUSH --dir .bench-tmp/powercut-async

# The scheduler's kill -9 campaign at length (not in CI; tests/scheduler/test_delay_crash.py runs 6 kills
# in the suite): SOAK_SCHEDULER_KILLS kills during delayed and timer delivery, every message exactly once.
SOAK_SCHEDULER_KILLS ?= 90
.PHONY: soak-scheduler
soak-scheduler: $(GENERATED)
	MQSTORE_SOAK_SCHEDULER_KILLS=$(SOAK_SCHEDULER_KILLS) MQSTORE_SOAK_SCHEDULER_PER_KILL=1000 \
		$(PY) -m pytest tests/scheduler/test_delay_crash.py -q -s --timeout 0

# The replication fault campaign at length (not in CI; tests/commitlog/test_replication.py kills a follower
# once in the suite): followers of a SYNC_MASTER leader killed and restarted under producers for
# SOAK_MINUTES (default 10), every stop point compared byte for byte; then as long again, leaders of
# three replicas on a local etcd killed and restarted (tests/commitlog/test_failover_soak.py); then as
# long again, the partition campaign's random faults (tests/commitlog/test_partition_campaign.py: kills of
# leader, follower, etcd and gateway, a wiped leader, partitions through the tests' proxies). SOAK_SEED=N
# repeats one.
.PHONY: soak-ha
soak-ha: $(GENERATED) etcd
	SOAK_HA_MINUTES=$${SOAK_MINUTES:-10} $(PY) -m pytest tests/commitlog/test_replication_soak.py \
		tests/commitlog/test_failover_soak.py tests/commitlog/test_partition_campaign.py -q -s --timeout 0

# The plain 4.9.8 HA wire in both directions against RocketMQ 4.9.8 itself (not in CI: it clones the tag
# from GitHub unless ROCKETMQ_GIT_DIR or ROCKETMQ_SRC names a copy): tools/rocketmq498/build.sh compiles
# its DefaultMessageStore with javac against Debian's jars into build/rocketmq498 (cached; once built,
# `make test` runs the check too), then tests/commitlog/test_rocketmq498_ha.py. docs/replication.md.
.PHONY: check-rocketmq-ha
check-rocketmq-ha: $(GENERATED)
	tools/rocketmq498/build.sh
	MQSTORE_REQUIRE_ROCKETMQ498=1 $(PY) -m pytest tests/commitlog/test_rocketmq498_ha.py -q

# The stats report's charts in docs/pipeline.md (docs/images/stats/), drawn from the tests' chart store
# (tests/pipeline/chart_store.py) by tools/stats_charts.py. Needs Java, as the pipeline's tests do.
.PHONY: docs-charts
docs-charts: $(GENERATED) java
	$(PY) tools/stats_charts.py

lint: $(GENERATED)
	$(VENV)/bin/ruff check services gateway pipeline mqstore tests bench tools
	$(VENV)/bin/mypy -p services -p gateway -p pipeline -p mqstore.client
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

# What replication costs, beside Redis (one replica, WAIT 1) and NATS (an R3 stream on 3 servers), and ten
# leader kills (bench/replication.py, about 5 min): REPLICATION_ARGS="--seconds 10 --flush SYNC_FLUSH".
REPLICATION_ARGS ?=
.PHONY: bench-replication
bench-replication: $(GENERATED) etcd
	$(PY) -m pip install --quiet --disable-pip-version-check -r bench/requirements-peers.txt
	$(PY) -m bench.replication $(REPLICATION_ARGS)

# The long differential soak (not in CI; tests/soak/soak.py): kill -9 of every service while producing,
# then every index and export compared with every other, and each round the damaged-copy check (a
# quarantined record). SOAK_MINUTES=60, SOAK_GEOMETRY=default (or small, or CL_BYTES,CQ_UNITS,SLOTS,ENTRIES),
# SOAK_SEED=N repeats a run's random choices. Each pipeline job is its own `mqstore pipeline` process here;
# make test's one short round (tests/soak/test_differential_soak.py) runs them in the suite's Spark session.
.PHONY: soak
soak: $(GENERATED) java
	$(PY) -m tests.soak.soak

# Memory over a long run (not in CI; bench/memory_soak.py): mqstore up under 64 clients for
# SOAK_MEMORY_MINUTES, every service's RSS sampled into .bench-tmp/memory-soak.csv, a verdict per service.
SOAK_MEMORY_MINUTES ?= 30
.PHONY: soak-memory
soak-memory: $(GENERATED)
	$(PY) -m bench.memory_soak --minutes $(SOAK_MEMORY_MINUTES)

# Two wheels in dist/ (packaging/build-wheels.sh, shared with the image build): mqstore-client (mqstore.client
# and the generated mqstore.v1) and mqstore (the servers), which depends on it.
DIST ?= dist
CLIENT_STAGE ?= build/mqstore-client
dist: $(GENERATED)
	rm -rf $(DIST)
	CLIENT_STAGE=$(CLIENT_STAGE) packaging/build-wheels.sh $(PY) $(DIST)
	@ls $(DIST)

clean:
	rm -rf $(VENV) gen build dist *.egg-info
