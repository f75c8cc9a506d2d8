"""The per-GPU agent daemon (run it with `freeride agent`)."""

from freeride.agent.config import AgentConfig

__all__ = ["AgentConfig"]
