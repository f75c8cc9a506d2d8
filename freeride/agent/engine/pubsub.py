"""Live-view events for the Watch RPC: every watcher has a bounded queue; a slow one loses events, counted."""

from __future__ import annotations

import asyncio

from freeride.agent.domain.events import AgentEvent

_QUEUE_EVENTS = 4096


class Hub:
    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[AgentEvent]] = set()
        self.dropped = 0  # events a full watcher queue did not take

    def __bool__(self) -> bool:
        """Whether anyone watches: events need not be built otherwise."""
        return bool(self._subscribers)

    def publish(self, event: AgentEvent) -> None:
        for q in self._subscribers:
            if q.full():
                self.dropped += 1
            else:
                q.put_nowait(event)

    def subscribe(self) -> asyncio.Queue[AgentEvent]:
        q: asyncio.Queue[AgentEvent] = asyncio.Queue(maxsize=_QUEUE_EVENTS)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[AgentEvent]) -> None:
        self._subscribers.discard(q)
