"""expire room."""
