"""The NAT rig's housekeeping outside any one rig: our namespaces by name (``vr<pid><letter>-<node>``),
deleting them and what runs in them (also after a SIGKILL: ``cleanup_stale``), running setup
commands, stopping processes, reading a line from a child with a bound, and whether this
machine can run the rig at all. ``rig.py`` builds and runs a rig on top of these.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence

NS_RE = re.compile(r"^vr(\d+)([a-z])-([a-z0-9_]+)$")
CMD_TIMEOUT = 30.0  # bound for every command the rig runs itself
KILL_GRACE = 2.0  # SIGTERM, then SIGKILL after this long
TABLE = "rig"  # nftables table name inside router namespaces


def _cmd(argv: Sequence[str], timeout: float = CMD_TIMEOUT, input: str | None = None) -> str:
    """Run a setup command; raise with its stderr when it fails."""
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=input)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def _pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (killed but not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def list_namespaces() -> list[str]:
    """Names of all network namespaces that look like ours (``vr<pid><letter>-<node>``)."""
    try:
        names = os.listdir("/run/netns")
    except OSError:
        return []
    return sorted(n for n in names if NS_RE.match(n))


def _kill_ns_pids(ns: str) -> None:
    try:
        pids = [int(p) for p in _cmd(["ip", "netns", "pids", ns], timeout=5).split()]
    except (RuntimeError, ValueError, subprocess.TimeoutExpired):
        return
    for pid in pids[:1000]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _delete_ns(ns: str) -> None:
    _kill_ns_pids(ns)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=CMD_TIMEOUT)


def cleanup_stale() -> list[str]:
    """Delete our namespaces (and processes in them) whose creating pid is dead; return them."""
    gone = []
    for ns in list_namespaces():
        m = NS_RE.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            _delete_ns(ns)
            gone.append(ns)
    return gone


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """One line from ``proc.stdout`` (a pipe) within ``timeout`` s; "" at EOF.

    Reads the file descriptor directly; use only this function on that pipe. Raises
    TimeoutError when no full line arrives in time.
    """
    buf: bytearray = proc.__dict__.setdefault("_rig_buf", bytearray())
    fd = proc.stdout.fileno()
    end = time.monotonic() + timeout
    while b"\n" not in buf:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no line from pid {proc.pid} within {timeout} s")
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            line = bytes(buf)
            buf.clear()
            return line.decode(errors="replace")
        buf += chunk
    i = buf.index(b"\n") + 1
    line = bytes(buf[:i])
    del buf[:i]
    return line.decode(errors="replace")


_probe: str | None | bool = False  # False: not probed yet


def unusable_reason() -> str | None:
    """Why the rig cannot run here (not root, no ``ip netns``, no nft), or None when it can."""
    global _probe
    if _probe is not False:
        return _probe
    _probe = None
    if os.geteuid() != 0:
        _probe = "NAT rig needs root (network namespaces and nftables)"
    elif not shutil.which("ip") or not shutil.which("nft"):
        _probe = "NAT rig needs the ip (iproute2) and nft (nftables) commands"
    else:
        ns = f"vr{os.getpid()}z-probe"
        try:
            _cmd(["ip", "netns", "add", ns])
            _cmd(["ip", "netns", "exec", ns, "nft", "-f", "-"],
                 input=f"table ip {TABLE} {{ chain p {{ type nat hook postrouting priority "
                       "srcnat; masquerade random,fully-random; }; }")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            _probe = f"ip netns / nftables NAT unusable here: {e}"
        finally:
            _delete_ns(ns)
    return _probe


def _terminate(p: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL after a grace period; reap it."""
    if p.poll() is None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass
            try:
                p.wait(KILL_GRACE)
                break
            except subprocess.TimeoutExpired:
                continue
    for f in (p.stdin, p.stdout, p.stderr):
        if f is not None:
            f.close()
