"""The tiering engine: copy protocol, remote index family, recovery, retention, GC (DESIGN §2)."""
