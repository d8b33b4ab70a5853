"""converge room."""
