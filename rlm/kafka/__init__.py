"""A read-only Kafka-protocol listener over rlm's tiered readers (docs/kafka-listener.md): Kafka
clients (kafka-python, aiokafka, librdkafka/kcat) read both tiers as if rlm were one broker.

``protocol`` frames and versions, ``reads`` one partition's Fetch/ListOffsets answers, ``api`` the
handlers, ``sasl`` SASL/PLAIN, ``server`` the asyncio server ``rlm run`` starts.
"""
