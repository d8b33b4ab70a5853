"""Reading (and, for tests and demos, writing) a Kafka log directory."""
