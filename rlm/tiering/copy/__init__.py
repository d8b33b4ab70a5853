"""copy room."""
