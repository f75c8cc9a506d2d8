"""The checks, one module per theme; each function takes a CheckContext and returns an Outcome (registry.py)."""
