"""The tiering engine: copy protocol, remote index family, recovery, retention, GC (docs/architecture.md)."""
