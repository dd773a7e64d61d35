"""End-to-end pipelines that tie the stack together (one module per pipeline)."""
