"""The package's version: one place, read by the agent (its welcome to trainers) and the metrics."""

__version__ = "0.1.0"
