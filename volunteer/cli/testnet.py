"""``volunteer testnet -n N``: a whole swarm on this machine, one process tree.

A relay (DHT bootstrap, AutoNAT, circuit relay) and N volunteers, each a real ``volunteer``
process on loopback sharing a grid of experts round-robin; a swarm file lets trainers join it
(``Swarm.join(path)``, ``volunteer experts PATH``). ``open_testnet`` is reused by the demo and
the digits example. Stopping (Ctrl-C, SIGTERM, or leaving the block) stops every process it
started: SIGTERM first (a graceful leave), SIGKILL after a deadline. If this process dies without
cleaning up, the children notice they were orphaned (``VOLUNTEER_EXIT_WITH_PARENT``) and leave.
(PR_SET_PDEATHSIG would not do: it fires when the *thread* that forked exits, and trio forks from
worker threads that come and go.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import trio

from ..errors import VolunteerError
from ..swarmfile import SwarmFileError, SwarmSpec, load_swarm_file, parse_experts_spec, swarms_dir
from .control import ControlError, request

START_TIMEOUT = 60.0
STOP_DEADLINE = 15.0
LOG_TAIL = 2000  # characters of a failed process's log shown in the error


async def exit_with_parent(leave) -> None:
    """If started by a testnet (``VOLUNTEER_EXIT_WITH_PARENT`` holds its pid), call ``leave()``
    once that process is gone, so no volunteer outlives the testnet that started it."""
    parent = os.environ.get("VOLUNTEER_EXIT_WITH_PARENT")
    if not parent or not parent.isdigit():
        return
    while _alive(int(parent)):
        await trio.sleep(1.0)
    leave()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Testnet:
    """A running local swarm."""

    workdir: Path
    swarm_file: Path
    relay_addr: str
    controls: list[Path] = field(default_factory=list)
    processes: list = field(default_factory=list)
    assignments: list[list[str]] = field(default_factory=list)
    kept: bool = True  # the directory outlives the testnet (--dir, VOLUNTEER_KEEP_TESTNET=1)
    env: dict[str, str] = field(default_factory=dict)  # every process's environment
    join_args: list[str] = field(default_factory=list)  # what every volunteer's command line shares
    expert_class: str | None = None
    _answered: set[Path] = field(default_factory=set)  # control sockets that answered once

    async def start_volunteer(self, uids: list[str], *, listen: str = "/ip4/127.0.0.1/tcp/0"):
        """Start one more volunteer hosting ``uids`` (none: the swarm file's placement decides),
        listening on ``listen``; its process, control socket and uids are appended here."""
        i = len(self.controls)
        control = self.workdir / f"v{i}.sock"
        args = [*_python(), "join", str(self.swarm_file), "--yes", "--listen", listen, "--no-dashboard",
                "--identity", str(self.workdir / f"v{i}.key"), "--control", str(control),
                "--checkpoints", str(self.workdir / f"checkpoints-v{i}"), *self.join_args]
        if uids:
            args += ["--experts", f"{self.expert_class}:{','.join(uids)}"]
        log = open(self.workdir / f"v{i}.log", "wb")
        # each volunteer keeps its contributions and history in the testnet's directory: not
        # in this user's state dir (where a demo's counts would pile up across runs), nor
        # shared by the testnet's volunteers
        own = dict(self.env, VOLUNTEER_STATE_DIR=str(self.workdir / f"state-v{i}"))
        proc = await trio.lowlevel.open_process(args, stdout=log, stderr=subprocess.STDOUT, env=own)
        log.close()
        self.processes.append(proc)
        self.controls.append(control)
        self.assignments.append(list(uids))
        return proc

    async def not_answering(self) -> int:
        """How many volunteers have never answered on their control sockets (asks only those)."""
        waiting = [path for path in self.controls if path not in self._answered]

        async def one(path: Path) -> None:
            try:
                await request(path, "status")
            except ControlError:
                return
            self._answered.add(path)

        async with trio.open_nursery() as nursery:
            for path in waiting:
                nursery.start_soon(one, path)
        return sum(path not in self._answered for path in self.controls)

    async def statuses(self) -> list[dict | None]:
        """Each volunteer's status snapshot (None for one that does not answer)."""
        out: list[dict | None] = [None] * len(self.controls)

        async def one(i: int, path: Path) -> None:
            try:
                out[i] = (await request(path, "status"))["status"]
            except ControlError:
                pass

        async with trio.open_nursery() as nursery:
            for i, path in enumerate(self.controls):
                nursery.start_soon(one, i, path)
        return out


def _python() -> list[str]:
    return [sys.executable, "-m", "volunteer"]


def logs_shown(log_path: Path, kept: bool) -> str:
    """Where to read why a testnet process failed: the log's path when the directory stays, else
    its last lines (a temporary directory is removed as the testnet stops: a path would point at
    nothing)."""
    if kept:
        return f"see {log_path}"
    try:
        tail = log_path.read_text(errors="replace").strip()[-LOG_TAIL:]
    except OSError:
        tail = ""
    shown = f"its log ended:\n{tail}" if tail else "its log was empty"
    return f"{shown}\n(the testnet's temporary directory is removed; --dir DIR or VOLUNTEER_KEEP_TESTNET=1 keeps the logs)"


async def _read_relay_addr(proc, log_path: Path, kept: bool = True) -> str:
    buffer = b""
    with trio.fail_after(START_TIMEOUT):
        while True:
            chunk = await proc.stdout.receive_some(4096)
            if not chunk:
                raise VolunteerError(f"the testnet relay exited early; {logs_shown(log_path, kept)}")
            buffer += chunk
            with open(log_path, "ab") as log:
                log.write(chunk)
            for line in buffer.decode(errors="replace").splitlines():
                if line.startswith("listening on /ip4/127.0.0.1/"):
                    return line.split(" ", 2)[2].strip()


async def _drain(stream, log_path: Path) -> None:
    with open(log_path, "ab") as log:
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            log.write(chunk)
            log.flush()


@asynccontextmanager
async def open_testnet(
    n: int,
    experts: str | None = "ffn:expert.[0:4].[0:4]",
    *,
    hidden_dim: int = 64,
    swarm_id: str = "testnet",
    workdir: Path | None = None,
    extra_join_args: list[str] | None = None,
    web: str | None = None,
    trainers: list[str] | None = None,
    listen_host: Callable[[int], str] = lambda i: "127.0.0.1",
    max_volunteers: int = 64,
    start_timeout: float = START_TIMEOUT,
    starting: int | None = None,
):
    """Start a relay and ``n`` volunteers; stop them all when the block ends. ``web``
    (``HOST:PORT``): the relay serves the swarm's public health page there. ``trainers``: the
    peer IDs the swarm file lists as its trainers (None: open to anyone). ``listen_host(i)``:
    the IP volunteer ``i`` listens and dials from (a loopback alias each, so that per-address
    limits see one household per volunteer: ``benchmarks/scale_processes.py``). ``starting``: at
    most this many volunteers start at once (each imports torch: dozens at once on a few cores
    all take minutes), the next when one answers on its control socket; ``start_timeout`` bounds
    the whole start."""
    if n < 1 or n > max_volunteers:
        raise VolunteerError(f"testnet: -n must be between 1 and {max_volunteers}")
    expert_class, uids = parse_experts_spec(experts) if experts else (None, [])
    own_dir = workdir is None
    kept = not own_dir or os.environ.get("VOLUNTEER_KEEP_TESTNET") == "1"  # else removed when the testnet stops
    workdir = Path(workdir or tempfile.mkdtemp(prefix="volunteer-testnet-"))
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file by that name, a read-only parent: one line, not a traceback
        raise VolunteerError(f"cannot use {workdir} as the testnet's directory: {exc.strerror}") from None
    env = dict(os.environ, PYTHONUNBUFFERED="1", VOLUNTEER_EXIT_WITH_PARENT=str(os.getpid()))
    processes = []
    # the experts as the swarm's [[grid]]: its volunteers then run the replica protocols, a donor
    # who joins places itself on it automatically, and the relay's health page maps it
    grid = grid_of_uids(expert_class, uids, hidden_dim) if expert_class else None
    watched = swarm_id
    if grid is not None:
        watched = str(workdir / "grid.toml")  # what the relay watches: the grid, before any address exists
        Path(watched).write_text(SwarmSpec(swarm_id, swarm_id, grids=[grid]).to_toml())
    try:
        async with trio.open_nursery() as nursery:
            relay = await trio.lowlevel.open_process(
                [*_python(), "relay", "--listen", "/ip4/127.0.0.1/tcp/0", "--no-dashboard", "--swarm", watched,
                 "--identity", str(workdir / "relay.key"), *(["--web", web] if web else [])],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            )
            processes.append(relay)
            relay_addr = await _read_relay_addr(relay, workdir / "relay.log", kept)
            nursery.start_soon(_drain, relay.stdout, workdir / "relay.log")
            spec = SwarmSpec(swarm_id, swarm_id, [], [_addr(relay_addr)], testnet_pid=os.getpid(),
                             trainers=list(trainers) if trainers else "open")
            if expert_class:
                spec.experts = {"hidden_dim": hidden_dim}
            if grid is not None:
                spec.grids = [grid]
            swarm_file = workdir / "swarm.toml"
            swarm_file.write_text(spec.to_toml())
            # loopback volunteers find each other through the relay: no mDNS on the real LAN
            net = Testnet(workdir, swarm_file, relay_addr, processes=processes, kept=kept, env=env,
                          join_args=["--no-mdns", "--hidden-dim", str(hidden_dim), *(extra_join_args or [])],
                          expert_class=expert_class)
            deadline = trio.current_time() + start_timeout
            for i in range(n):
                if starting is not None:
                    await _wait_ready(net, deadline - trio.current_time(), pending=starting - 1)
                await net.start_volunteer(uids[i::n], listen=f"/ip4/{listen_host(i)}/tcp/0")
            await _wait_ready(net, deadline - trio.current_time())
            try:
                yield net
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await stop_processes(processes)
        if not kept:
            shutil.rmtree(workdir, ignore_errors=True)


def grid_of_uids(expert_class: str, uids: list[str], hidden_dim: int):
    """The GridSpec whose uids are exactly ``uids`` (``expert.[0:4].[0:4]`` is a 4×4 grid), or
    None when they are not one whole grid (a list of scattered uids)."""
    from ..dht.grid import parse_uid
    from ..swarmfile import GridSpec, GridSpecError

    parsed = [parse_uid(uid) for uid in uids]
    if not parsed or len({(prefix, len(coords)) for prefix, coords in parsed}) != 1:
        return None
    prefix, first = parsed[0]
    size = tuple(max(coords[d] for _, coords in parsed) + 1 for d in range(len(first)))
    try:
        grid = GridSpec(prefix, size, expert_class, hidden_dim)
    except GridSpecError:
        return None
    return grid if set(grid.uids()) == set(uids) and len(uids) == grid.count else None


def _addr(text: str):
    from ..net.multiaddr import Multiaddr

    return Multiaddr(text)


async def _wait_ready(net: Testnet, timeout: float = START_TIMEOUT, *, pending: int = 0) -> None:
    """Until at most ``pending`` volunteers have yet to answer on their control sockets; raises
    if one exits or ``timeout`` passes."""
    with trio.move_on_after(timeout) as scope:
        while True:
            for i, proc in enumerate(net.processes):
                if proc.poll() is not None:
                    name = "relay" if i == 0 else f"v{i - 1}"
                    tail = (net.workdir / f"{name}.log").read_text(errors="replace")[-LOG_TAIL:]
                    raise VolunteerError(f"testnet: {name} exited with status {proc.returncode}:\n{tail}")
            if await net.not_answering() <= pending:
                return
            await trio.sleep(0.2)
    if scope.cancelled_caught:
        late = [i for i, status in enumerate(await net.statuses()) if status is None] or [0]
        raise VolunteerError(f"testnet: volunteers not ready after {timeout:.0f} s (v{late[0]}: "
                             f"{logs_shown(net.workdir / f'v{late[0]}.log', net.kept)})")


async def stop_processes(processes: list, deadline: float = STOP_DEADLINE) -> None:
    """SIGTERM every live process (volunteers first, the relay last), then SIGKILL stragglers."""
    for proc in reversed(processes):
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    with trio.move_on_after(deadline):
        for proc in processes:
            await proc.wait()
    for proc in processes:
        if proc.poll() is None:
            proc.kill()
            await proc.wait()


# --- the command ------------------------------------------------------------------------------------
def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "testnet", help="start a local swarm (a relay and N volunteers) on this machine",
        description="Start a whole swarm on loopback: a relay and N volunteer daemons sharing a grid of "
        "experts. Writes a swarm file trainers can join. Ctrl-C stops every process it started.",
        epilog="examples:\n  volunteer testnet -n 4\n  volunteer testnet -n 20 --experts 'ffn:expert.[0:8].[0:8]' --hidden-dim 256\n"
        "  volunteer testnet -n 4 --name mynet   # then: volunteer experts mynet; Swarm.join('mynet')\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-n", type=int, default=4, metavar="N", help="volunteers to start (default 4)")
    p.add_argument("--experts", default="ffn:expert.[0:4].[0:4]", metavar="CLASS:PATTERN",
                   help="grid shared round-robin, declared as the swarm file's [[grid]] (donors who join place themselves on it)")
    p.add_argument("--hidden-dim", type=int, default=64, metavar="N")
    p.add_argument("--name", default="testnet",
                   help="swarm name; its file is written to <config dir>/swarms/NAME.toml unless a real swarm's file is there, "
                   "and removed when the testnet stops")
    p.add_argument("--dir", type=Path, metavar="DIR", help="where keys, logs and sockets go (default: a temporary directory)")
    p.add_argument("--no-dashboard", action="store_true")
    p.add_argument("--trainer", action="append", type=_peer_id, metavar="PEER-ID",
                   help="list this peer as one of the swarm's trainers (repeatable; default: anyone may train)")
    p.add_argument("--web", type=_host_port, metavar="HOST:PORT",
                   help="the relay serves the swarm's public health page at http://HOST:PORT/")
    p.set_defaults(run=run_testnet)


def _peer_id(text: str) -> str:
    """``--trainer`` checked as a peer ID (argparse prints the error in one line)."""
    from ..net.identity import PeerID

    try:
        return str(PeerID.from_string(text))
    except VolunteerError as exc:
        raise argparse.ArgumentTypeError(f"not a peer ID: {exc}") from None


def _host_port(text: str) -> str:
    """``--web`` checked as the relay checks it, kept as typed: the testnet hands it to the relay."""
    from ..web.serve import host_port_arg

    host_port_arg(text)
    return text


def run_testnet(args: argparse.Namespace) -> int:
    if not 1 <= args.n <= 64:
        raise VolunteerError("-n must be between 1 and 64")
    named = swarms_dir() / f"{args.name}.toml"
    check_named_swarm_file(named, args.name)  # before starting anything: fail in one line, at once
    return trio.run(_testnet, args, named)


def check_named_swarm_file(path: Path, name: str) -> None:
    """Refuse to start when ``path`` is a real swarm's file, or a running testnet's."""
    if not path.exists():
        return
    try:
        owner = load_swarm_file(path).testnet_pid
    except SwarmFileError:
        owner = None
    if owner is None:
        raise VolunteerError(
            f"{path} is a swarm file that no testnet wrote, so it stays as it is; choose another name with --name"
        )
    if owner != os.getpid() and _alive(owner):
        raise VolunteerError(f"testnet {name!r} is already running (pid {owner}); stop it, or choose another name with --name")


def write_named_swarm_file(path: Path, text: str, name: str) -> None:
    """Write a testnet's swarm file only where none is, or where a dead testnet left its own."""
    check_named_swarm_file(path, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()  # a stale testnet's (checked just above): ours replaces it
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise VolunteerError(f"{path} appeared while the testnet started; choose another name with --name") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)


def remove_named_swarm_file(path: Path) -> None:
    """Remove the testnet's swarm file if it is still this process's (it points at a relay that is gone)."""
    try:
        if load_swarm_file(path).testnet_pid == os.getpid():
            path.unlink()
    except (SwarmFileError, OSError):
        pass


async def _testnet(args: argparse.Namespace, named: Path) -> int:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_testnet(args.n, args.experts, hidden_dim=args.hidden_dim, swarm_id=args.name, workdir=args.dir,
                                web=args.web, trainers=args.trainer) as net:
            write_named_swarm_file(named, net.swarm_file.read_text(), args.name)
            try:
                print(f"testnet {args.name!r}: relay {net.relay_addr}", flush=True)
                print(f"  {args.n} volunteers ready; swarm file {named} (removed when the testnet stops)", flush=True)
                if args.web:
                    print(f"  swarm health page: http://{args.web}/", flush=True)
                print(f"  try: volunteer experts {args.name}   |   volunteer join {args.name}   |   Ctrl-C stops everything", flush=True)
                async with trio.open_nursery() as nursery:
                    if sys.stdout.isatty() and not args.no_dashboard:
                        nursery.start_soon(_show, net)
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        break
                print("stopping the testnet…", flush=True)
            finally:
                remove_named_swarm_file(named)
    print("testnet stopped", flush=True)
    return 0


async def _show(net: Testnet) -> None:
    from rich.live import Live


    with Live(testnet_table(net, [None] * len(net.controls)), auto_refresh=False) as live:
        while True:
            live.update(testnet_table(net, await net.statuses()), refresh=True)
            await trio.sleep(1.0)


def testnet_table(net: Testnet, statuses: list[dict | None]):
    """One row per volunteer: peer, reachability, experts, requests, routing table."""
    from rich.table import Table

    from ..widgets import short

    table = Table(title=f"testnet · relay {short(net.relay_addr)}", expand=False)
    for column in ("#", "peer", "reach", "experts", "requests", "DHT peers", "paused"):
        table.add_column(column)
    for i, status in enumerate(statuses):
        if status is None:
            table.add_row(str(i), "-", "starting…", str(len(net.assignments[i])), "-", "-", "-")
            continue
        requests = sum(e.get("requests", 0) for e in status.get("experts", []))
        table.add_row(
            str(i),
            short(status["peer_id"]),
            (status.get("reachability") or {}).get("status", "?"),
            str(len(status.get("experts", []))),
            str(requests),
            str((status.get("dht") or {}).get("routing_table", "-")),
            "yes" if status.get("paused") else "no",
        )
    return table
