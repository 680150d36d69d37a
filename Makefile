# The commands of the README: `make demo`, `make test` (and `make test-fast`, the edit loop).
# Each does its own set-up, idempotently (stamp files), so they work on a fresh Debian machine
# with Python 3.11 and Node 20.

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
NODE_DIR    := tests/clients/node
PYTEST_ARGS ?=

.PHONY: setup setup-system setup-python setup-node setup-kafka setup-java-client native demo lint test test-fast test-pure test-spark-cluster fuzz bench soak regen clean

setup: setup-system setup-python setup-node native setup-kafka setup-java-client

# Debian tools the tests use (tshark and tcpdump as oracles, ip for network namespaces,
# prometheus and promtool as the real scraper, chromium and its chromedriver as the browser,
# Maven and a JDK for the Apache Kafka brokers and the Java client),
# as command:package. Installed only when missing, so a machine that has them needs neither
# root nor the network.
SYSTEM_TOOLS := tshark:tshark tcpdump:tcpdump ip:iproute2 prometheus:prometheus promtool:prometheus \
	chromium:chromium chromedriver:chromium-driver mvn:maven javac:openjdk-17-jdk-headless
# Packages whose Debian service must not keep running: the tests start their own server.
NO_SERVICE := prometheus
setup-system:
	@missing=""; for t in $(SYSTEM_TOOLS); do command -v $${t%%:*} >/dev/null || missing="$$missing $${t#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "error: missing$$missing; install as root: apt-get install -y$$missing" >&2; exit 1; fi; \
	  echo "installing$$missing (apt-get)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	  for s in $(NO_SERVICE); do case " $$missing " in *" $$s "*) \
	    if [ -d /run/systemd/system ]; then systemctl disable --now -q $$s; \
	    else /etc/init.d/$$s stop >/dev/null; update-rc.d $$s disable >/dev/null; fi;; esac; done; \
	fi

# Reinstall when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,pipeline]'
	@touch $@
setup-python: $(VENV)/.installed

# The compiled hot path (setup.py): pip builds it at install; rebuilt in place whenever one of
# its sources changes, since capture/_native.py runs a module whose source changed as Python.
NATIVE_SRC := setup.py capture/packets.py capture/flows.py \
	$(addprefix capture/kafka/,readers.py headers.py bodies.py sasl.py states.py resync.py tally.py topic_walk.py topics.py \
	connection.py) \
	$(wildcard capture/*.pxd capture/kafka/*.pxd)
$(VENV)/.native: $(VENV)/.installed $(NATIVE_SRC)
	$(PY) setup.py --quiet build_ext --inplace
	@touch $@
native: $(VENV)/.native

$(NODE_DIR)/node_modules/.installed: $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@
setup-node: $(NODE_DIR)/node_modules/.installed

# Apache Kafka brokers as test peers (harness/kafka_broker.py): Maven copies each pinned line's
# runtime jars into build/kafka/<version>/ and the JMX exporter agent beside them; its local
# repository caches them. The versions are pinned in the harness (KAFKA_VERSIONS, JMX_AGENT_VERSION).
build/kafka/.installed: harness/kafka/pom.xml harness/kafka_broker.py
	$(PYTHON) -m harness.kafka_broker install
	@touch $@
setup-kafka: build/kafka/.installed

# The Java client as a real test client (harness/java_client.py): Maven builds tests/clients/java
# against the pinned kafka-clients (JAVA_CLIENT_VERSION) into build/java-client/<version>/, the
# class and its runtime jars; its local repository caches them.
JAVA_CLIENT_SRC := tests/clients/java/pom.xml $(wildcard tests/clients/java/src/main/java/*.java) \
	$(wildcard tests/clients/java/src/main/resources/*)
build/java-client/.installed: $(JAVA_CLIENT_SRC) harness/java_client.py
	$(PYTHON) -m harness.java_client build
	@touch $@
setup-java-client: build/java-client/.installed

# Apache Kafka 4 with two brokers, a capture sidecar each, the aggregator in front, seven real clients (tests/deploy/demo.py).
demo: setup
	$(PY) tests/deploy/demo.py

# Lint and types, first in make test and make test-fast (seconds): ruff over the repository and
# mypy over capture/, exporter/ and tools/, configured in pyproject.toml ([tool.ruff], [tool.mypy]).
lint: setup-python
	$(PY) -m ruff check --quiet .
	$(PY) -m mypy

# The whole suite with the compiled hot path, then the core and capture tests (and the
# differential ones) once more on the pure-Python reference (KAFKA_CENSUS_PURE_PYTHON=1).
PURE_TESTS := $(addprefix tests/core/,test_connection.py test_connection_identity.py test_core_states.py \
	test_readers.py test_golden.py test_core_properties.py test_hostile.py test_hostile_flows.py \
	test_sasl_lost_answer.py test_fuzz.py test_fuzz_flows.py test_native.py test_topics.py test_topics_walks.py) \
	tests/capture/test_capture_synthetic.py tests/capture/test_topics_capture.py
test: setup lint
	$(PY) -m pytest $(PYTEST_ARGS)
	KAFKA_CENSUS_PURE_PYTHON=1 $(PY) -m pytest -q $(PURE_TESTS) $(PYTEST_ARGS)

# The edit loop: the unit and property tests, none of the tiers (markers e2e, spark, slow;
# tests/conftest.py). Starts no peer (tests/conftest.py fails a test outside the e2e and spark
# tiers that starts one), so it needs neither root, tshark, Node nor Spark. make test runs it too.
FAST := not e2e and not spark and not slow
test-fast: native lint
	$(PY) -m pytest -q -m "$(FAST)" $(PYTEST_ARGS)

test-pure: setup
	KAFKA_CENSUS_PURE_PYTHON=1 $(PY) -m pytest -q $(PURE_TESTS) $(PYTEST_ARGS)

# Every fleet job on a real Spark standalone cluster (a master and two workers from the pyspark
# installation, on loopback), its outputs against local[*]'s; make test runs it too.
test-spark-cluster: setup
	$(PY) -m pytest -q tests/pipeline/test_spark_cluster.py $(PYTEST_ARGS)

# A long random search with the fuzz harness (make test runs it short and derandomized):
# FUZZ_EXAMPLES per test, ~15 min at 10000; failures are kept in .hypothesis/ and replayed first.
FUZZ_EXAMPLES ?= 10000
fuzz: setup-python
	KAFKA_CENSUS_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest tests/core/test_fuzz.py tests/core/test_fuzz_flows.py -q $(PYTEST_ARGS)

# Benchmarks (not tests): each runs kafka-census and a peer in the same run and prints ratios.
bench: setup bench/data/produce.pcap
	$(PY) -m bench.core_decode
	$(PY) -m bench.replay
	$(PY) -m bench.live
	$(PY) -m bench.exporter
	$(PY) -m bench.aggregate
	$(PY) -m bench.pipeline
	$(PY) -m bench.eventlog_volume
	$(PY) -m bench.fingerprint_eval --in-sample
	$(PY) -m bench.kafka_producer
	$(PY) -m bench.proxy

# Long (50,000 connection cycles through live capture and through the proxy): not in `make bench`, not in CI.
soak: setup
	$(PY) -m bench.soak

bench/data/produce.pcap:
	$(PY) -m bench.record_produce_pcap --out $@

# Regenerate committed generated files (tests fail if they drift). Inputs read at generation time
# and never copied in (docs/dependencies.md): the newest pinned Kafka's message schemas, inside the
# kafka-clients jar setup-kafka installs (build/kafka/<version>/, harness/kafka_broker.py pins it),
# the API table's first source for the Kafka 4.x facts; and, from outside the repository:
#   SCHEMAS=DIR       Apache Kafka's message schemas: DIR/3.9-trunk/ holds every file of
#                     clients/src/main/resources/common/message/ of apache/kafka at commit
#                     1eb7644349cb07139d6a3c1ad1986979647cac99 (2024-10-25, before KIP-896);
#                     DIR/4.x-subset/ the copies kafka-python 3.0.12 ships under
#                     kafka/protocol/schemas/resources/ (Kafka 4.1+ era). Any 4.x API in neither
#                     the jar nor the subset comes from the kio package pinned in pyproject.toml.
#   FINGERPRINTS=DIR  DIR/java-client-max-versions.tsv: the highest request version each Apache
#                     Kafka release 0.10.0.0-3.9.0's Java client sends, from the same apache/kafka.
# Both default to $KAFKA_SCHEMAS_DIR / $KAFKA_FINGERPRINTS_DIR; there is no other default: without
# them the generators stop with one line naming the variable and what DIR must hold (tools/regen.py).
SCHEMAS      ?= $(KAFKA_SCHEMAS_DIR)
FINGERPRINTS ?= $(KAFKA_FINGERPRINTS_DIR)
regen: export KAFKA_SCHEMAS_DIR := $(SCHEMAS)
regen: export KAFKA_FINGERPRINTS_DIR := $(FINGERPRINTS)
regen: setup-python setup-kafka
	$(PY) -m tools.gen_apis
	$(PY) -m tools.gen_topics
	$(PY) -m tools.gen_fingerprints
	$(PY) -m tools.gen_targets
	$(PY) dashboards/generate.py

clean:
	rm -rf $(VENV) $(NODE_DIR)/node_modules .pytest_cache .hypothesis .mypy_cache .ruff_cache
