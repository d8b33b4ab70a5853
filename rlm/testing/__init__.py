"""Test helpers shipped with rlm: the storage backend conformance suite (:mod:`.backend_suite`)."""
