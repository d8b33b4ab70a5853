"""Kafka record batches (magic 2) and legacy message sets (magic 0/1): decode, verify, encode.

Layout (FORMATS.md §2, all integers big-endian). Every log entry starts with
``offset int64 @0, size int32 @8`` (size = bytes after these 12) and carries its magic at @16.

Magic 2 record batch, 61-byte header::

    0  baseOffset int64        27 baseTimestamp int64
    8  batchLength int32       35 maxTimestamp int64
    12 partitionLeaderEpoch    43 producerId int64
    16 magic int8 = 2          51 producerEpoch int16
    17 crc uint32 (CRC-32C     53 baseSequence int32
       over [21, end))         57 recordsCount int32
    21 attributes int16        61 records (compressed as one block when codec != none)
    23 lastOffsetDelta int32

Magic 0/1 message: ``offset int64, size int32, crc uint32 (CRC-32 over [16, end)), magic int8,
attributes int8, [timestamp int64, v1], keyLen int32 + key, valueLen int32 + value``.
"""
