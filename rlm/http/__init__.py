"""The HTTP API of ``rlm run`` (DESIGN §5) and a Python client for it."""
