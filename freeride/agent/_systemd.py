"""sd_notify(3) without libsystemd: tell systemd (Type=notify) when the agent serves and when it stops.

The protocol is one unix datagram of newline-separated KEY=VALUE lines sent to $NOTIFY_SOCKET;
an address starting with '@' is in the abstract namespace. Outside systemd (no $NOTIFY_SOCKET)
every call is a no-op, so the agent runs the same under a shell, Slurm or Kubernetes.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


def notify(*lines: str, env: Mapping[str, str] | None = None) -> bool:
    """Send `lines` (e.g. "READY=1", "STATUS=serving") to systemd; True when a datagram was sent.

    Never raises: a broken notification socket must not take the agent down (systemd will then
    time the start out, which is the visible failure).
    """
    address = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        target = "\0" + address[1:]  # abstract namespace
    elif address.startswith("/"):
        target = address
    else:
        log.warning("NOTIFY_SOCKET=%r is not a unix socket path; not notifying systemd", address)
        return False
    payload = "\n".join(line.replace("\n", " ") for line in lines).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(target)
            sock.sendall(payload)
    except OSError as exc:
        log.warning("could not notify systemd at %s: %s", address, exc)
        return False
    return True
