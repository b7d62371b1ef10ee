"""experts."""
