"""The HTTP API of ``rlm run`` (docs/http-api.md) and a Python client for it."""
