"""rlm: a tiered-storage remote log manager for Kafka-format log directories."""

__version__ = "0.1.0"
