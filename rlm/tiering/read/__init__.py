"""read room."""
