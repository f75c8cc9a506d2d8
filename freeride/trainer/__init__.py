"""Trainer integrations: `connect()` and the generic reporter here, framework hooks in their own modules.

    from freeride.trainer import connect
    reporter = connect()            # this rank's agent: $FREERIDE_AGENT, else its GPU's socket
    reporter.start(slot, kind)      # the training thread is about to wait
    reporter.end(slot, kind)        # the wait is over

The trainer side imports neither the agent nor the CLI: a training process loads only this
package, the core utilities and the generated messages.
"""

from freeride.trainer._connect import agent_address, connect
from freeride.trainer.reporter import BubbleReporter, Pipeline

__all__ = ["BubbleReporter", "Pipeline", "agent_address", "connect"]
