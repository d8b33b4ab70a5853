"""The long-running side of ``rlm run``: scheduling, signals, logs."""
