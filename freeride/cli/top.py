"""`freeride top`: a live table of tasks and GPUs across agents, redrawn when the agents report events.

Each agent's Watch stream only wakes the view; the numbers come from one Stats call per agent and
redraw, at most a few times a second (it is a terminal UI, not the control path), and at least
every --interval so clocks and uptimes move.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from freeride.cli import _agents
from freeride.cli.common import UsageError, console, progress_text
from freeride.cli.multi import STATE_NAMES, totals, trainer_paths, trainers_text
from freeride.client import AgentClient
from freeride.core.units import format_seconds
from freeride.errors import FreerideError
from freeride.v1 import tasks_pb2

if TYPE_CHECKING:
    from rich.console import Group

_MIN_REDRAW_S = 0.25
_STATE_STYLE = {"RUNNING": "green", "READY": "cyan", "FAILED": "red", "PAUSED": "yellow", "STARTING": "blue"}


@dataclass
class Frame:
    """One reading of every agent: its Stats, or None when it did not answer."""

    rows: list[tuple[str, tasks_pb2.StatsResponse | None]]
    taken_unix_s: float


def fetch(clients: list[AgentClient]) -> Frame:
    rows: list[tuple[str, tasks_pb2.StatsResponse | None]] = []
    for c in clients:
        try:
            rows.append((c.target, c.stats()))
        except FreerideError:  # no answer (or a refused one): the row says so
            rows.append((c.target, None))
    return Frame(rows, time.time())


def render(frame: Frame, expand: bool = True) -> Group:
    """The view; `expand` spreads the tables over the terminal's width (not when piped)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    live = [s for _, s in frame.rows if s is not None]
    total = totals(live)
    head = Text(
        f"freeride top  {time.strftime('%H:%M:%S', time.localtime(frame.taken_unix_s))}  "
        f"{len(live)}/{len(frame.rows)} agents  harvested {format_seconds(total['harvested_s'])} of "
        f"{format_seconds(total['bubble_s'])} bubble time ({total['efficiency']:.1%})",
        style="bold",
    )
    gpus = Table(title="GPUs", title_justify="left", expand=expand)
    for col in ("gpu", "agent", "up", "trainers", "bubbles", "bubble s", "harvested s", "efficiency", "steps",
                "overruns"):
        gpus.add_column(col, justify="right" if col not in ("agent",) else "left")
    tasks = Table(title="tasks", title_justify="left", expand=expand)
    for col in ("gpu", "id", "name", "state", "harvested s", "steps", "overrun", "progress"):
        tasks.add_column(col, justify="right" if col in ("harvested s", "steps", "overrun") else "left")
    for target, s in frame.rows:
        if s is None:
            gpus.add_row("?", target, "-", "-", "-", "-", "-", "no answer", "-", "-", style="red")
            continue
        g = s.gpu
        eff = f"{g.harvested_s / g.bubble_s:.1%}" if g.bubble_s else "-"
        gpus.add_row(
            str(g.gpu), target, format_seconds(g.uptime_s), trainers_text(g.trainers, trainer_paths(g.trainer_streams)),
            str(g.bubbles), f"{g.bubble_s:.2f}", f"{g.harvested_s:.2f}", eff, str(g.steps), str(g.overrun_steps),
        )
        for t in s.tasks:
            state = STATE_NAMES[t.state]
            c = t.counters
            tasks.add_row(
                str(g.gpu), t.id, t.spec.name, Text(state, style=_STATE_STYLE.get(state, "")),
                f"{c.harvested_s:.2f}", str(c.steps), f"{c.overrun_steps} ({format_seconds(c.overrun_s)})",
                progress_text(t.progress, limit=3),
            )
    return Group(head, gpus, tasks)


class _Wakeups:
    """One thread per agent on its Watch stream; any event sets `changed`."""

    def __init__(self, clients: list[AgentClient]) -> None:
        self.changed = threading.Event()
        self._streams = []
        for c in clients:
            stream = c.watch()  # (lazy: a failure comes while iterating)
            self._streams.append(stream)
            threading.Thread(target=self._run, args=(stream,), daemon=True).start()

    def _run(self, stream: object) -> None:
        try:
            for _ in stream:  # type: ignore[attr-defined]
                self.changed.set()
        except FreerideError:
            self.changed.set()  # the agent went away: show it

    def close(self) -> None:
        for s in self._streams:
            s.cancel()


class _CtrlC:
    """Ctrl-C ends the view through a flag, not a KeyboardInterrupt: one raised while a gRPC call waits is checked
    for by gRPC's C core, which can swallow it, and `top` then went on redrawing (seen in CI: Ctrl-C did nothing).

    The handler takes no lock. Python runs it in the main thread between two bytecodes, which can be inside the
    loop's own `Event.wait()` or `clear()` while that thread holds the event's lock: setting the event there
    waited for the lock forever (top hung after Ctrl-C, CI, fix 39). So the handler sets the flag and writes a
    byte to a pipe; a relay thread, blocked reading it, sets the events. The previous handler is put back on exit.
    """

    def __init__(self, wake: threading.Event) -> None:
        self.pressed = False
        self._wake = wake
        self._stop = threading.Event()
        self._previous: object = None
        self._closing = False
        self._read_fd, self._write_fd = os.pipe()
        self._relay = threading.Thread(target=self._relay_presses, name="top-ctrl-c", daemon=True)

    def __enter__(self) -> _CtrlC:
        self._relay.start()
        self._previous = signal.signal(signal.SIGINT, self._press)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:  # None: the handler was not set from Python (nothing to put back)
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
        self._closing = True
        os.write(self._write_fd, b"x")  # the relay's last read
        self._relay.join()
        os.close(self._read_fd)
        os.close(self._write_fd)

    def _press(self, signum: int, frame: object) -> None:
        self.pressed = True
        os.write(self._write_fd, b"!")  # no lock taken: see the class's note

    def _relay_presses(self) -> None:
        while os.read(self._read_fd, 1) and not self._closing:
            self._stop.set()
            self._wake.set()

    def sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)


def cmd_top(ns: argparse.Namespace) -> int:
    if ns.interval <= 0:
        raise UsageError(f"--interval must be > 0 seconds, got {ns.interval}")
    agents = _agents.resolve(ns)
    clients = [_agents.client(ns, t) for t in agents.targets]
    con = console()
    expand = con.is_terminal
    try:
        frame = fetch(clients)
        if all(s is None for _, s in frame.rows):
            raise UsageError(_agents.nobody_answers(agents.targets))
        if ns.once:
            con.print(render(frame, expand))
            return 0
        from rich.live import Live

        wake = _Wakeups(clients)
        try:
            # The handler first: once the first frame shows, Ctrl-C ends the view (even where SIGINT came ignored,
            # as in a job a non-interactive shell started in the background).
            with _CtrlC(wake.changed) as ctrl_c, \
                    Live(render(frame, expand), console=con, auto_refresh=False, screen=False) as live:
                while not ctrl_c.pressed:
                    wake.changed.wait(ns.interval)
                    wake.changed.clear()
                    if ctrl_c.pressed:
                        break
                    live.update(render(fetch(clients), expand), refresh=True)
                    ctrl_c.sleep(_MIN_REDRAW_S)  # UI rate cap: bubbles can end hundreds of times a second
            return 0
        except KeyboardInterrupt:  # pressed before the handler was in place, or after it was restored
            return 0
        finally:
            wake.close()
    finally:
        for c in clients:
            c.close()
