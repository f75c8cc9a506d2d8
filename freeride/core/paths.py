"""Where agents listen: the runtime directory, each GPU's default socket, and gRPC target strings.

Shared by the agent (which binds the socket), the clients and the trainer side (which find it),
so that none of them imports another's package for a path.
"""

from __future__ import annotations

import grp
import os
import socket
import stat
from pathlib import Path


def default_runtime_dir() -> Path:
    """Where sockets live: $FREERIDE_SOCKET_DIR, $XDG_RUNTIME_DIR/freeride, else /tmp/freeride-<uid>."""
    explicit = os.environ.get("FREERIDE_SOCKET_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_RUNTIME_DIR")
    return Path(base) / "freeride" if base else Path(f"/tmp/freeride-{os.getuid()}")


def default_socket(gpu: int) -> Path:
    return default_runtime_dir() / f"agent-gpu{gpu}.sock"


def agent_target(address: str | None = None, gpu: int = 0) -> str:
    """A gRPC target: an explicit address (unix path, unix:..., host:port) or the GPU's default socket."""
    if not address:
        return f"unix:{default_socket(gpu)}"
    if address.startswith(("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")):
        return address
    if address.startswith(("/", ".")) or address.endswith(".sock"):
        return f"unix:{Path(address).absolute()}"
    return address


_FILE_KINDS = ((stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
               (stat.S_ISFIFO, "a fifo"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def file_kind(mode: int) -> str:
    """What a stat mode is, in words ("a regular file", "a socket", ...): for messages about a socket path."""
    return next((name for test, name in _FILE_KINDS if test(mode)), "something else")


def socket_access_problem(target: str) -> str:
    """Why this user may not connect to a unix-socket target, in one line ("" when permissions are not the
    cause: no such socket, nobody listening, a TCP target). A connection refused for permissions is no missing
    agent: the fix is a group membership, not `freeride agent`."""
    if not target.startswith("unix:") or target.startswith("unix-abstract:"):
        return ""
    path = Path(target.removeprefix("unix:").removeprefix("//"))
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return ""
    except PermissionError:
        pass
    except OSError:
        return ""
    finally:
        probe.close()
    try:
        st = path.stat()
    except PermissionError:
        return f"permission denied: the directory of socket {path} keeps this user out ({path.parent})"
    except OSError:
        return ""
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    mode = stat.S_IMODE(st.st_mode)
    if os.geteuid() == st.st_uid or st.st_gid == os.getegid() or st.st_gid in os.getgroups():
        return f"permission denied on socket {path} (mode {mode:04o}, group {group})"
    return (f"permission denied: not in group {group} of socket {path} (mode {mode:04o}); ask the agent's "
            f"operator to add you to {group}, then log in again")
