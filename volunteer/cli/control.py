"""The daemon's local control channel: ``volunteer status / pause / resume`` talk to ``join``.

One JSON request line, one JSON reply line per connection::

    → {"cmd": "status"}            ← {"ok": true, "status": {...snapshot...}}
    → {"cmd": "pause"}             ← {"ok": true}

On Unix it is a Unix socket, mode 0600 in a 0700 directory (the user's runtime dir), so only
the user can reach it. Where Unix sockets are missing (older Windows) or when
``VOLUNTEER_CONTROL=tcp``, it is a loopback TCP port whose number and a random token are written
to ``<path>.tcp`` (0600): a client must present the token, so other local users cannot drive it.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import stat
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Awaitable, Callable, Iterator

import trio

from ..errors import VolunteerError

# bytes of a Unix socket's path: sun_path holds 108 on Linux (104 on BSD and macOS), its NUL included
MAX_UNIX_PATH = 103 if sys.platform == "darwin" or "bsd" in sys.platform else 107
MAX_REQUEST = 64 * 1024
MAX_REPLY = 16 * 1024 * 1024
REQUEST_TIMEOUT = 10.0

Handler = Callable[[dict], Awaitable[dict]]


class ControlError(VolunteerError):
    """No daemon answers on the control channel, or it refused the request."""


def use_tcp() -> bool:
    return os.environ.get("VOLUNTEER_CONTROL") == "tcp" or not hasattr(socket, "AF_UNIX")


def _unix_path_reachable(path: Path) -> bool:
    """Whether a Unix socket can live at ``path``: it fits ``sun_path``, or (Linux) a longer one
    is reached through its directory's descriptor (``_reachable_unix_path``)."""
    return len(os.fsencode(str(path))) <= MAX_UNIX_PATH or os.path.isdir("/proc/self/fd")


@contextmanager
def _reachable_unix_path(path: Path) -> Iterator[str]:
    """A name for the socket at ``path`` that fits ``sun_path``: ``path`` itself, or, when it is
    longer (a deep temporary directory), the same file through an open descriptor of its
    directory (``/proc/self/fd/N/name``, Linux)."""
    if len(os.fsencode(str(path))) <= MAX_UNIX_PATH:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def _prepare_dir(path: Path) -> None:
    # every directory made here is the user's alone: a runtime dir made 0755 on the way would be
    # refused by the next command's platformdirs (it wants XDG_RUNTIME_DIR 0700)
    missing = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)
    if os.name == "posix":
        mode = stat.S_IMODE(path.parent.stat().st_mode)
        if mode & 0o077:
            os.chmod(path.parent, 0o700)


async def _read_line(stream: trio.abc.Stream, limit: int) -> bytes:
    data = bytearray()
    while b"\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ControlError("control message too large")
    return bytes(data.split(b"\n", 1)[0])


class DaemonLock:
    """The one thing that decides "a daemon already runs with this control path": an exclusive
    lock (``flock``; ``msvcrt.locking`` on Windows) on ``<path>.lock``, held for the process's
    life and released by the kernel when it ends, crash or not. Two daemons started in the same
    instant cannot both hold it, whichever control channel (Unix socket or TCP) they use; the
    file itself is never deleted (a path unlinked while locked would let a third daemon lock a
    new file of the same name)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> "DaemonLock":
        """Take the lock, or raise ControlError naming the running daemon's control path."""
        if not use_tcp() and not _unix_path_reachable(self.path):
            raise ControlError(f"control socket path {self.path} is too long for a Unix socket "
                               f"({len(os.fsencode(self.path))} bytes, at most {MAX_UNIX_PATH}): give a shorter --control PATH")
        try:
            _prepare_dir(self.path)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            parent = next((p for p in self.path.parents if p.exists()), None)
            why = f"{parent} is not a directory" if parent is not None and not parent.is_dir() else exc.strerror or str(exc)
            raise ControlError(f"cannot use control socket {self.path}: {why}; "
                               "give --control PATH in a directory of yours") from None
        try:
            _lock_exclusive(fd)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK, errno.EDEADLK):
                raise ControlError(
                    f"another daemon is already running with control socket {self.path} "
                    "(stop it with `volunteer stop`, or give this one its own --control PATH)"
                ) from None
            raise
        self._fd = fd
        return self

    @property
    def held(self) -> bool:
        """Whether this process holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Let another daemon start (the process's exit does it too)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the lock
            self._fd = None


def _lock_exclusive(fd: int) -> None:
    if sys.platform == "win32":  # a lock on the file's first byte
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


async def serve_control(
    path: Path, handler: Handler, *, lock: DaemonLock | None = None, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    """Answer control requests at ``path`` until cancelled; removes the socket (or port file) on exit.

    ``lock``: the daemon's lock on ``path``, taken by the caller as early as it can (none given:
    taken here); only its holder ever binds the socket or writes (and removes) the port file."""
    path = Path(path)
    own_lock = lock is None
    lock = lock if lock is not None else DaemonLock(path).acquire()
    if not lock.held or lock.path != path:
        raise ControlError(f"the daemon does not hold the lock of {path}")
    try:
        await _serve_locked(path, handler, task_status=task_status)
    finally:
        if own_lock:
            lock.release()


async def _serve_locked(path: Path, handler: Handler, *, task_status) -> None:
    token = ""
    if use_tcp():
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        await sock.bind(("127.0.0.1", 0))
        token = secrets.token_hex(16)
        marker = path.with_name(path.name + ".tcp")
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"port": sock.getsockname()[1], "token": token}, f)
    else:
        marker = path
        if path.exists() or path.is_symlink():  # we hold the lock: a socket left by a daemon that died
            path.unlink()
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is created 0600: no window where others may connect
        try:
            with _reachable_unix_path(path) as name:
                await sock.bind(name)
        finally:
            os.umask(old)
    sock.listen(16)
    listener = trio.SocketListener(sock)

    async def one(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                with trio.fail_after(REQUEST_TIMEOUT):
                    request = json.loads(await _read_line(stream, MAX_REQUEST) or b"{}")
                if not isinstance(request, dict):
                    raise ControlError("a control request is a JSON object")
                if token and not secrets.compare_digest(str(request.get("token", "")), token):
                    reply = {"ok": False, "error": "bad token"}
                else:
                    reply = await handler(request)
            except (ValueError, ControlError, trio.TooSlowError) as exc:
                reply = {"ok": False, "error": str(exc) or type(exc).__name__}
            try:
                await stream.send_all(json.dumps(reply, default=str).encode() + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    try:
        async with listener:
            await trio.serve_listeners(one, [listener], task_status=task_status)
    finally:
        try:
            marker.unlink()
        except OSError:
            pass


async def request(path: Path, cmd: str, **fields) -> dict:
    """Send one command to the daemon at ``path``; raises ControlError if none answers."""
    path = Path(path)
    message = {"cmd": cmd, **fields}
    try:
        with trio.fail_after(REQUEST_TIMEOUT):
            tcp_marker = path.with_name(path.name + ".tcp")
            if use_tcp() or (not path.exists() and tcp_marker.exists()):
                try:
                    info = json.loads(tcp_marker.read_text())
                except (OSError, ValueError):
                    raise ControlError(f"no daemon running (no {tcp_marker}); start one with `volunteer join SWARM`") from None
                message["token"] = info.get("token", "")
                stream = await trio.open_tcp_stream("127.0.0.1", int(info["port"]))
            else:
                if not path.exists():
                    raise ControlError(f"no daemon running (no control socket {path}); start one with `volunteer join SWARM`")
                with _reachable_unix_path(path) as name:
                    stream = await trio.open_unix_socket(name)
            async with stream:
                await stream.send_all(json.dumps(message).encode() + b"\n")
                line = await _read_line(stream, MAX_REPLY)
    except OSError as exc:
        raise ControlError(f"cannot reach the daemon at {path}: {exc.strerror or exc}") from None
    except trio.TooSlowError:
        raise ControlError(f"the daemon at {path} did not answer within {REQUEST_TIMEOUT:.0f} s") from None
    try:
        reply = json.loads(line)
    except ValueError:
        raise ControlError("the daemon's reply is not JSON") from None
    if not reply.get("ok"):
        raise ControlError(f"the daemon refused {cmd!r}: {reply.get('error', 'unknown error')}")
    return reply


def compute_seconds(controls, attempts: int = 3) -> list[float | None]:
    """Each daemon's compute seconds this session (its runtime's busy time, from ``status``), for
    benchmarks and examples that report a volunteer's utilisation; None where no answer came in
    ``attempts`` tries (a loaded machine's daemon may miss the control deadline once). Blocking:
    call it outside a trio run."""
    seconds: list[float | None] = []
    for control in controls:
        found = None
        for _ in range(attempts):
            try:
                status = trio.run(request, Path(control), "status")["status"]
                found = float(status["contributions"]["session"]["compute_s"])
                break
            except (ControlError, KeyError, TypeError, ValueError):
                continue
        seconds.append(found)
    return seconds


def default_control_path() -> Path:
    from ..swarmfile import runtime_dir

    return runtime_dir() / "daemon.sock"


__all__ = ["ControlError", "compute_seconds", "default_control_path", "request", "serve_control"]
