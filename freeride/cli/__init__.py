"""The `freeride` command line: the product's commands (app.py), their implementations and views."""
