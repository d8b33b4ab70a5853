"""The live Kafka brokers of these suites (tests/kafkaservers.py): ``kafka_single`` is shared by
the whole package and stopped after its last test, so no broker idles through the rest of the run."""

from tests.kafkaservers import kafka_single, kafka_trio  # noqa: F401 - pytest fixtures
