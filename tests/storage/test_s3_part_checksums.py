"""The ``s3`` plugin's part checksums (#35): on a plain-HTTP endpoint it computes each part's
CRC-32C itself and sends it, so the store verifies every part and botocore computes no CRC32 of
its own; over HTTPS botocore's CRC32 stays (sent in a trailer, no payload SHA-256)."""

from __future__ import annotations

import pytest

from rlm.testing.backend_suite import payload
from tests.s3servers import S3Target

pytestmark = pytest.mark.s3
s3 = pytest.importorskip("rlm_storage_s3.backend")
multipart = pytest.importorskip("rlm_storage_s3.multipart")

MiB = 1024 * 1024


def test_part_checksum_is_crc32c_big_endian_base64() -> None:
    # CRC-32C("123456789") = 0xE3069283 (RFC 3720 check value); CRC32's would be 0xCBF43926.
    assert multipart.part_checksum(b"123456789") == {"ChecksumCRC32C": "4waSgw=="}


@pytest.mark.parametrize(
    ("endpoint", "calculation", "algorithm"),
    [
        ("http://127.0.0.1:1", "when_supported", {"ChecksumAlgorithm": "CRC32C"}),
        ("HTTP://127.0.0.1:1", "when_supported", {"ChecksumAlgorithm": "CRC32C"}),
        ("https://127.0.0.1:1", "when_supported", {"ChecksumAlgorithm": "CRC32"}),
        (None, "when_supported", {"ChecksumAlgorithm": "CRC32"}),  # AWS: https
        ("http://127.0.0.1:1", "when_required", {}),
    ],
)
def test_own_checksums_only_on_plain_http(
    endpoint: str | None, calculation: str, algorithm: dict[str, str]
) -> None:
    with s3.S3Backend(
        bucket="b", endpoint_url=endpoint, region="us-east-1", request_checksum_calculation=calculation
    ) as b:
        assert b._part_algorithm() == algorithm


def test_multipart_parts_carry_their_crc32c(s3_target: S3Target) -> None:
    """On the real server: every part was sent with its CRC-32C (which botocore cannot compute
    without awscrt, so it is the plugin's) and the object's composite checksum is built from them."""
    data = payload(11 * MiB + 5, 7)
    with s3.S3Backend(**s3_target.options(part_size="5MiB", multipart_threshold="5MiB")) as b:
        b.put("parts", data)
        assert b.read("parts") == data
        client = s3_target.client()
        head = client.head_object(Bucket=s3_target.bucket, Key=b._full("parts"), ChecksumMode="ENABLED")
        client.close()
    assert str(head.get("ChecksumCRC32C", "")).endswith("-3"), head
    assert "ChecksumCRC32" not in head
