"""local room."""
