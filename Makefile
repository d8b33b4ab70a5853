# rlm — the two commands a newcomer needs are `make run` and `make test` (see README.md).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
PLUGINS := $(wildcard plugins/*/pyproject.toml)
# The compiled parts (setup.py): a changed C source rebuilds them in place.
NATIVE  := setup.py $(wildcard rlm/formats/records/*.c rlm/formats/records/*.h)
# The suites that decode records (export/read_tiered, lookups, /records?format=json, rlm fetch), run a
# second time on the pure-Python reference decoder (docs/decoder.md). Not rerun: restores (they copy
# bytes, decode nothing), the fixture lookups and the Spark reads — tests/formats/test_native_decoder.py
# already holds both decoders equal on every fixture segment, and a Spark executor decodes through
# the same task_to_arrow as export_local.
DECODE_TESTS := tests/lookup/test_visibility.py tests/lookup/test_first_offset.py tests/lookup/test_property.py \
                tests/http/test_api.py tests/jobs/test_export_local.py tests/tiering/test_transactions.py
# The record-scan suites run a second time on the pure-Python walk (docs/scan.md).
SCAN_TESTS := tests/formats/test_records.py tests/formats/test_records_fixtures.py tests/formats/test_scan_native.py
STAMP  := $(VENV)/.installed
# The pinned Kafka runtime of the live-broker suites, benches and `make demo-kafka` (tools/kafka/pom.xml).
KAFKA_VERSION := 4.1.1
KAFKA_LIBS    := .cache/kafka-$(KAFKA_VERSION)/libs
# The pinned HDFS of the HDFS suites and benches (tools/hdfs/pom.xml).
HADOOP_VERSION := 3.4.2
HDFS_LIBS      := .cache/hadoop-$(HADOOP_VERSION)/libs
# Spark 4.1 with the pinned Iceberg Spark runtime and sqlite-jdbc: the suite where Spark's Iceberg
# reads and maintains rlm's tables (tools/iceberg-spark/pom.xml says why not the installed pyspark).
ICEBERG_VERSION    := 1.12.0
ICEBERG_SPARK_LIBS := .cache/iceberg-spark-$(ICEBERG_VERSION)/libs
# Hadoop's S3A connector for pyspark's own Hadoop client (tools/spark-s3a/pom.xml): the s3a:// exports.
SPARK_HADOOP_VERSION := 3.5.0
SPARK_S3A_LIBS       := .cache/spark-s3a-$(SPARK_HADOOP_VERSION)/libs
DEMO   ?= demo

.PHONY: kafka hdfs iceberg-spark spark-s3a demo-kafka install run test test-fast lint bench bench-copy bench-scale bench-kafka kafka-tiered bench-kafka-rlm soak fuzz fuzz-parsers fuzz-kafka fuzz-http clean browser toolchain kcat

# Idempotent: the venv is rebuilt only when a dependency declaration or a C source changed; the
# compiled extensions (setup.py) are rebuilt too when the scan's is missing (a fresh checkout of a
# branch, a git clean): importing rlm.formats.records with RLM_REQUIRE_NATIVE=1 fails then.
install: $(STAMP) kafka hdfs iceberg-spark spark-s3a
	@RLM_REQUIRE_NATIVE=1 $(BIN)/python -c "import rlm.formats.records" 2>/dev/null \
	    || $(BIN)/python -m pip install --quiet --no-deps -c constraints.txt -e .

$(STAMP): pyproject.toml constraints.txt $(PLUGINS) $(NATIVE)
	@$(MAKE) --no-print-directory toolchain
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[http,spark,iceberg,dev]' \
		$(foreach p,$(dir $(PLUGINS)),-e $(p))
	@touch $(STAMP)

# A pinned Java runtime from Maven Central, once (a no-op while its pom is unchanged): $(1) what it
# is, $(2) the pom, $(3) the folder its runtime jars are copied to. Maven is installed with apt-get
# when missing and we are root; without Java or Maven this says so in one line and install goes
# on: `make run` needs neither, and the suites needing one fail in CI (skip elsewhere) naming
# what is missing.
define fetch_runtime
	@if ! command -v java >/dev/null 2>&1; then \
	    echo "no java on PATH: the $(1) of the tests cannot run (install Java 17+)"; exit 0; fi; \
	if ! command -v mvn >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing maven to fetch the $(1) (apt-get)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends maven >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
	         apt-get install -y -q --no-install-recommends maven >/dev/null; } || true; fi; \
	if ! command -v mvn >/dev/null 2>&1; then \
	    echo "no mvn on PATH: cannot fetch the $(1) for the tests"; exit 0; fi; \
	echo "fetching the $(1) into $(3) (Maven, once)"; \
	rm -rf $(3) && mkdir -p $(3) && mvn -q -B -f $(2) dependency:copy-dependencies \
	    -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(3) >$(3)/../fetch.log 2>&1 \
	    && touch $(3)/.complete || { echo "fetching the $(1) failed: see $(3)/../fetch.log"; rm -rf $(3); }
endef

# Kafka's runtime jars: the live brokers of tests/live, the benches and `make demo-kafka`.
kafka: $(KAFKA_LIBS)/.complete

$(KAFKA_LIBS)/.complete: tools/kafka/pom.xml
	$(call fetch_runtime,Kafka $(KAFKA_VERSION) runtime,tools/kafka/pom.xml,$(KAFKA_LIBS))

# Kafka's own tiered storage (the kafka-storage test-jar holding LocalTieredStorage), for
# bench/kafka_rlm_bench.py's second broker only: a folder of its own, so the live-broker suites'
# runtime above stays Kafka's release jars (tools/kafka-tiered/pom.xml says why).
KAFKA_TIERED_LIBS := .cache/kafka-tiered-$(KAFKA_VERSION)/libs
kafka-tiered: $(KAFKA_TIERED_LIBS)/.complete

$(KAFKA_TIERED_LIBS)/.complete: tools/kafka-tiered/pom.xml
	$(call fetch_runtime,Kafka $(KAFKA_VERSION) LocalTieredStorage test-jar,tools/kafka-tiered/pom.xml,$(KAFKA_TIERED_LIBS))

# Hadoop's MiniDFSCluster (hadoop-minicluster): the live HDFS of the HDFS suites (rlm/testing/hdfs_cluster.py).
hdfs: $(HDFS_LIBS)/.complete

$(HDFS_LIBS)/.complete: tools/hdfs/pom.xml
	$(call fetch_runtime,HDFS $(HADOOP_VERSION) runtime,tools/hdfs/pom.xml,$(HDFS_LIBS))

# Spark 4.1 + iceberg-spark-runtime + sqlite-jdbc (rlm/testing/iceberg_spark.py): Spark's own Iceberg
# reading and maintaining an rlm table (tests/spark/test_iceberg_spark_runtime.py). No test-fast test needs it.
iceberg-spark: $(ICEBERG_SPARK_LIBS)/.complete

$(ICEBERG_SPARK_LIBS)/.complete: tools/iceberg-spark/pom.xml
	$(call fetch_runtime,Iceberg $(ICEBERG_VERSION) Spark runtime,tools/iceberg-spark/pom.xml,$(ICEBERG_SPARK_LIBS))

# hadoop-aws and the AWS SDK modules it calls (14 MB, not the SDK's 686 MB bundle): the jars a Spark
# job needs for s3a:// paths (docs/export.md), used by tests/spark/test_export_connectors.py.
spark-s3a: $(SPARK_S3A_LIBS)/.complete

$(SPARK_S3A_LIBS)/.complete: tools/spark-s3a/pom.xml
	$(call fetch_runtime,Spark S3A connector (Hadoop $(SPARK_HADOOP_VERSION)),tools/spark-s3a/pom.xml,$(SPARK_S3A_LIBS))

# A single-node Kafka, a producer and rlm beside it (rlm/testing/demo_kafka.py): watch segments roll
# and get tiered on the status page (http://127.0.0.1:9464/). Ctrl-C stops all three. `make run` stays
# the embedded default.
demo-kafka: install
	$(BIN)/python -m rlm.testing.demo_kafka --dir demo-kafka

run: install
	@test -d $(DEMO)/kafka-logs || $(BIN)/rlm generate --out $(DEMO)/kafka-logs
	$(BIN)/rlm run --config configs/local.toml

# The suite runs on RLM_TEST_WORKERS pytest-xdist workers (0: serially, in one process). Most tests
# wait on subprocesses (brokers, S3 servers, Spark, daemons), so 2 workers keep 2 cores busy.
# loadgroup: tests sharing an expensive fixture stay on one worker (tests/xdist_groups.py,
# CONTRIBUTING.md "Running in parallel"). The decoder rerun is parallel too (418 s against 541 s
# serially, measured side by side on a loaded machine); the scan rerun (10 s) stays serial.
RLM_TEST_WORKERS ?= 2
PARALLEL := -n $(RLM_TEST_WORKERS) --dist loadgroup

# RLM_REQUIRE_NATIVE: a compiled extension that did not build fails the run instead of falling
# back quietly (docs/decoder.md, docs/scan.md); the reruns cover the pure-Python references.
test: install lint browser kcat
	RLM_REQUIRE_NATIVE=1 $(BIN)/python -m pytest -q --durations=25 $(PARALLEL)
	RLM_DECODER=python $(BIN)/python -m pytest -q -p no:cacheprovider $(PARALLEL) $(DECODE_TESTS)
	RLM_SCAN=python $(BIN)/python -m pytest -q -p no:cacheprovider $(SCAN_TESTS)

# The fast loop while developing: no lint, no browser, no Spark/S3-server/subprocess suites. On the
# workers too: 571 s against 784 s serially, back to back on a machine others were loading.
test-fast: install
	RLM_REQUIRE_NATIVE=1 $(BIN)/python -m pytest -q -x $(PARALLEL) -m "not integration and not spark and not s3 and not hdfs and not slow"

# The compiled extensions need a C compiler and Python's headers. Installs Debian's gcc (and the
# headers of a Debian python) when missing and we are root with apt-get; otherwise says why —
# rlm then installs without them and `make test` fails on RLM_REQUIRE_NATIVE (docs/decoder.md).
toolchain:
	@if command -v cc >/dev/null 2>&1 && $(PYTHON) -c "import sysconfig,os,sys; \
	    sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing a C compiler and Python headers for rlm's compiled parts (apt-get)"; \
	    pkgs="gcc libc6-dev"; $(PYTHON) -c "import sys; sys.exit(not sys.prefix.startswith('/usr'))" \
	        && pkgs="$$pkgs $$(basename $$($(PYTHON) -c 'import sys; print(sys.executable)'))-dev"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$pkgs >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
	         apt-get install -y -q --no-install-recommends $$pkgs >/dev/null; } \
	    || echo "could not install $$pkgs: rlm's compiled parts will not build"; \
	else echo "no C compiler or Python headers, and not root with apt-get: rlm's compiled parts will not build"; fi

# The status-page tests drive a real headless Chromium (tests/ui). Installs Debian's `chromium`
# when none is on PATH and we are root with apt-get; otherwise says why and those tests skip.
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	    || command -v google-chrome >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium for the status-page tests (apt-get)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
	         apt-get install -y -q --no-install-recommends chromium >/dev/null; } \
	    || echo "could not install chromium: the status-page browser tests will skip"; \
	else echo "no chromium and not root with apt-get: the status-page browser tests will skip"; fi

# The Kafka listener's tests read through librdkafka with Debian's `kcat` (tests/kafka). Installed
# when missing and we are root with apt-get; otherwise says why and the kcat test skips.
kcat:
	@if command -v kcat >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing kcat for the Kafka listener tests (apt-get)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends kcat >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
	         apt-get install -y -q --no-install-recommends kcat >/dev/null; } \
	    || echo "could not install kcat: the kcat test will skip"; \
	else echo "no kcat and not root with apt-get: the kcat test will skip"; fi

# mypy: strict over rlm and both plugins (the `files` of pyproject's [tool.mypy]).
lint: install
	$(BIN)/ruff check rlm tests bench plugins
	$(BIN)/ruff format --check rlm tests bench plugins
	$(BIN)/mypy
	$(BIN)/lint-imports

# The quick benches (minutes); bench-copy and bench-scale take longer. Each appends to BENCHMARKS.md.
bench: install
	$(BIN)/python bench/scan_bench.py
	AWS_DEFAULT_REGION=us-east-1 $(BIN)/python bench/lookup_bench.py
	$(BIN)/python bench/export_bench.py --partitions 8 --mib 32 --runs 2,4,8

# rlm pass vs boto3 upload_file to a moto S3 server (4 x 256 MiB); partitions x segments scaling.
bench-copy: install
	$(BIN)/python bench/copy_bench.py

bench-scale: install
	$(BIN)/python bench/scale_bench.py

# Consumer catch-up through the Kafka listener vs the HTTP stream (docs/kafka-listener.md).
bench-kafka: install
	$(BIN)/python bench/kafka_bench.py

# rlm (plain broker + rlm run) beside Kafka's own tiered storage on the same records (#35 item 3).
bench-kafka-rlm: install kafka-tiered
	$(BIN)/python bench/kafka_rlm_bench.py

# Minutes of produce + tier through faults + SIGKILL/restart, then invariant checks (not in CI).
SOAK_MINUTES ?= 10
soak: install
	$(BIN)/python bench/soak.py --minutes $(SOAK_MINUTES)

# Every fuzzer, for minutes (`make test` runs each with a bounded budget); see docs/fuzzing.md.
# One target per fuzzer: add the next as a prerequisite of `fuzz`.
fuzz: fuzz-parsers fuzz-kafka fuzz-http

# The parsers' suite (tests/fuzz) with the large Hypothesis profile; prints each one's example count.
fuzz-parsers: install
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q tests/fuzz --hypothesis-show-statistics

# The Kafka listener's frames and handlers, coverage-guided (atheris): FUZZ_KAFKA_SECONDS of it;
# a finding is written to .fuzz/kafka/ (crash-*) with the input that reproduces it.
FUZZ_KAFKA_SECONDS ?= 300
fuzz-kafka: install
	mkdir -p .fuzz/kafka/corpus
	$(BIN)/python fuzz/kafka_frames.py -max_total_time=$(FUZZ_KAFKA_SECONDS) -rss_limit_mb=2048 \
	    -artifact_prefix=.fuzz/kafka/ .fuzz/kafka/corpus

# schemathesis against the OpenAPI document of a running `rlm run` (docs/fuzzing.md); `make test`
# runs the same test with 15 examples per operation
fuzz-http: install
	RLM_FUZZ_HTTP_EXAMPLES=500 $(BIN)/python -m pytest -q tests/fuzz/test_fuzz_openapi.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
