"""Index files, Kafka's and rlm's (docs/formats.md §4, §5): a segment's ``.index``
(:mod:`offset_index`), ``.timeindex`` (:mod:`time_index`) and ``.txnindex`` (:mod:`txn_index`), the
three read together for one segment (:mod:`segment_index`) and built from its batches
(:mod:`index_builder`); rlm's ``.remotelogindex`` entries (:mod:`remote_index`) and the
``.remoteoffsetindex``/``.remotetimeindex`` derived from them (:mod:`remote_index_derived`). Pure,
like all of rlm.formats: buffers in, frozen dataclasses out."""
