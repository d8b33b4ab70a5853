"""The moto S3 server fixtures of tests/storage, for the lookup tests that count S3 requests."""

from tests.storage.conftest import aws_env, moto_endpoint  # noqa: F401 - pytest fixtures
