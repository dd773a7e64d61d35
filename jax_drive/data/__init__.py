"""Dataset builders and data cards (language interface)."""
