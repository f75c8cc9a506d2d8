"""Trainer integrations: the generic reporter here, framework hooks in their own modules."""

from freeride.trainer.reporter import BubbleReporter

__all__ = ["BubbleReporter"]
