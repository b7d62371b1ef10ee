"""``volunteer join`` (the daemon) and the commands that talk to it: status, pause, resume, stop."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from pathlib import Path

import trio

from ..errors import VolunteerError
from ..net.identity import load_or_create_keypair
from ..swarmfile import identity_path, load_config, load_limits, parse_experts_spec, resolve_swarm, state_dir, swarms_dir
from .control import ControlError, default_control_path, request

JOIN_EXAMPLES = """\
examples:
  volunteer join demo                                   host what the swarm's [[grid]] needs most (else serve the DHT only)
  volunteer join demo --max-experts 4                   the same, at most 4 experts
  volunteer join demo --experts ffn:expert.[0:4].[0:8]  host 32 experts of a 4x8 grid
  volunteer join ./myswarm.toml --experts transformer:block.[0:2] --hidden-dim 1024 --device cuda:0
  volunteer join /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW... --swarm-id demo --no-dashboard
SWARM is a path to the swarm file its organiser gave you, a NAME saved as
<config dir>/swarms/NAME.toml, or a bootstrap multiaddr. Ctrl-C leaves gracefully (experts withdrawn, checkpoints saved); press it
again to quit at once. `volunteer status` shows the same dashboard from another terminal.
"""


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError("expected a fraction in (0, 1], e.g. 0.5")
    return value


# device names torch takes that make sense for experts; anything else is refused in one line
# before torch lists its twenty device types at the user
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|(cuda|xpu)(:\d+)?")


def check_device_name(device: str) -> str:
    """``device`` if it names a device experts can run on; VolunteerError saying what to type if not."""
    if not DEVICE_PATTERN.fullmatch(device):
        raise VolunteerError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N (e.g. --device cuda:0), or mps")
    return device


def _rate(text: str) -> float:
    from ..net.perf import parse_size

    try:
        return float(parse_size(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (e.g. 10MiB for 10 MiB/s)") from None


def _host_port(text: str) -> tuple[str, int]:
    from .relaycmd import host_port

    return host_port(text)


def add_control_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--control", type=Path, metavar="PATH",
        help="control socket (default: $VOLUNTEER_RUNTIME_DIR or $XDG_RUNTIME_DIR/volunteer/daemon.sock)",
    )


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "join", help="donate this machine: join a swarm, host experts, show the dashboard",
        description="Join a swarm as a volunteer: become reachable (relays, hole punching), serve the DHT, "
        "host PyTorch experts and announce them, until Ctrl-C.",
        epilog=JOIN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("swarm", metavar="SWARM", help="swarm name, swarm file, or bootstrap multiaddr")
    p.add_argument("--experts", metavar="CLASS:PATTERN", help="experts to host, e.g. ffn:expert.[0:4].[0:8] (default: the swarm "
                   "file's [experts].experts, else automatic placement on its [[grid]], else none)")
    p.add_argument("--max-experts", type=int, metavar="N", help="automatic placement hosts at most N experts "
                   "(default: what fits in --max-gpu-memory of the GPU, else 8 without a GPU; 0: route the DHT only)")
    # demos and tests of churn re-check placement more often than every 120 s
    p.add_argument("--recheck-period", type=float, metavar="S", help=argparse.SUPPRESS)
    p.add_argument("--hidden-dim", type=int, metavar="N", help="expert width (default: the swarm file's, else 64)")
    p.add_argument("--expert-file", metavar="FILE.py", help="a Python file that registers custom expert classes")
    p.add_argument("--device", help="auto (CUDA if present), cpu, cuda:0, … (default auto)")
    p.add_argument("--max-batch", type=int, metavar="N", help="largest batch per expert call (default 1024)")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="settings file (default ~/.config/volunteer/config.toml): [join] device = \"cuda:0\", max_batch = 256, …")
    p.add_argument("--max-gpu-memory", type=_fraction, metavar="FRACTION", help="cap torch's share of GPU memory, e.g. 0.5")
    p.add_argument("--max-upload", type=_rate, metavar="RATE", help="cap the upload of expert replies, bytes/s (e.g. 5MiB)")
    p.add_argument("--listen", action="append", metavar="MULTIADDR", help="listen address (repeatable; default /ip4/0.0.0.0/tcp/0 and /ip4/0.0.0.0/udp/0/quic-v1, "
                   "and the same on /ip6/:: with a global IPv6 address)")
    p.add_argument("--swarm-id", help="swarm id when SWARM is a bare multiaddr (default: default)")
    p.add_argument("--identity", type=Path, metavar="PATH", help="identity key (default $VOLUNTEER_IDENTITY or ~/.config/volunteer/identity.key)")
    p.add_argument("--checkpoints", type=Path, metavar="DIR", help="checkpoint directory (default ~/.local/state/volunteer/checkpoints/SWARM)")
    p.add_argument("--share-tracebacks", choices=("full", "redacted", "none"), default=None,
                   help="what your expert errors show trainers: full tracebacks, redacted (paths relative "
                   "to the package or ~; the default), or none (type and message only)")
    p.add_argument("--no-dashboard", action="store_true", help="plain log lines, even in a terminal")
    p.add_argument("--metrics", type=_host_port, metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9101)")
    p.add_argument("--no-mdns", action="store_true",
                   help="do not look for volunteers of this swarm on the LAN (mDNS); also VOLUNTEER_NO_MDNS=1")
    p.add_argument("--no-port-mapping", action="store_true",
                   help="do not ask the home router to forward our ports (UPnP IGD, NAT-PMP, PCP); also "
                   "[join] port_mapping = false in the config, or VOLUNTEER_NO_PORT_MAPPING=1")
    add_control_flag(p)
    p.set_defaults(run=run_join)

    for name, helptext in (
        ("status", "show a running daemon's dashboard (or --json for scripts)"),
        ("pause", "stop taking expert requests and withdraw the experts from the DHT"),
        ("resume", "take expert requests again and re-declare the experts"),
        ("stop", "ask a running daemon to leave gracefully"),
    ):
        q = sub.add_parser(name, help=helptext, description=helptext[0].upper() + helptext[1:] + ".",
                           epilog=f"examples:\n  volunteer {name}\n  volunteer {name} --control /run/user/1000/volunteer/daemon.sock\n",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        add_control_flag(q)
        if name == "status":
            q.add_argument("--json", action="store_true", help="print one JSON snapshot and exit")
            q.add_argument("--once", action="store_true", help="print the dashboard once and exit (default when not a terminal)")
        q.set_defaults(run=run_control, control_cmd=name)


def port_mapping_wanted(args: argparse.Namespace, settings: dict) -> bool:
    """Whether join asks the router for port mappings: not with --no-port-mapping, nor with
    port_mapping = false in the settings, nor with VOLUNTEER_NO_PORT_MAPPING=1 (which the stack's
    default honours)."""
    return not getattr(args, "no_port_mapping", False) and settings.get("port_mapping", True) \
        and os.environ.get("VOLUNTEER_NO_PORT_MAPPING") != "1"


def build_options(args: argparse.Namespace):
    from ..net.interfaces import default_listen_addrs
    from ..net.stack import StackOptions
    from ..node import VolunteerOptions
    from .daemon import DaemonOptions

    spec = resolve_swarm(args.swarm, swarm_id=args.swarm_id)
    if spec.testnet_pid is not None:
        from .testnet import _alive

        if not _alive(spec.testnet_pid):
            raise VolunteerError(
                f"swarm file {spec.path} belongs to a testnet that is no longer running (pid {spec.testnet_pid}); "
                f"start one with `volunteer testnet --name {spec.name}`, or delete the file"
            )
    # precedence: flags, then the swarm file's [experts], then config.toml's [join], then built-ins
    settings = {**load_config(args.config), **spec.experts}

    def pick(flag, key, default):
        return flag if flag is not None else settings.get(key, default)

    experts = pick(args.experts, "experts", None)
    expert_class, uids = (None, [])
    if experts:
        expert_class, uids = parse_experts_spec(experts)
    max_experts = getattr(args, "max_experts", None)
    if max_experts is not None and max_experts < 0:
        raise VolunteerError("--max-experts must be 0 or more")
    replicas_config = None
    if getattr(args, "recheck_period", None):
        from ..replicas import ReplicasConfig

        replicas_config = ReplicasConfig(recheck_period=args.recheck_period)
    hidden = int(pick(args.hidden_dim, "hidden_dim", 64))
    if hidden < 1:
        raise VolunteerError("--hidden-dim must be positive")
    keypair, _ = load_or_create_keypair(args.identity or identity_path())
    node = VolunteerOptions(
        keypair=keypair,
        # TCP and QUIC on IPv4, and on IPv6 too when this machine has a global IPv6 address
        listen=pick(args.listen, "listen", default_listen_addrs()),
        expert_class=expert_class,
        uids=uids,
        hidden_dim=hidden,
        device=check_device_name(pick(args.device, "device", "auto")),
        max_batch=int(pick(args.max_batch, "max_batch", 1024)),
        checkpoint_dir=args.checkpoints or state_dir() / "checkpoints" / spec.id,
        max_gpu_memory=pick(args.max_gpu_memory, "max_gpu_memory", None),
        max_upload=pick(args.max_upload, "max_upload", None),
        expert_file=pick(args.expert_file, "expert_file", None),
        mdns=not args.no_mdns and settings.get("mdns", True) and os.environ.get("VOLUNTEER_NO_MDNS") != "1",
        stack=None if port_mapping_wanted(args, settings) else StackOptions(port_mapping=False),
        share_tracebacks=pick(args.share_tracebacks, "share_tracebacks", "redacted"),
        place=not uids and bool(spec.grids) and max_experts != 0,  # no experts named: the grid decides
        max_experts=max_experts,
        limits=load_limits(args.config),
        replicas_config=replicas_config,
    )
    return DaemonOptions(swarm=spec, node=node, control_path=args.control or default_control_path(), state_dir=state_dir())


def run_join(args: argparse.Namespace) -> int:
    options = build_options(args)
    metrics = getattr(args, "metrics", None)
    if options.node.uids or options.node.place:
        from ..experts.checkpoints import check_checkpoint_dir  # torch: only when hosting experts

        # found now, in one line (CheckpointDirError), not as a traceback when leaving with updates
        check_checkpoint_dir(options.node.checkpoint_dir)
    dashboard = sys.stdout.isatty() and not args.no_dashboard
    return trio.run(join, options, dashboard, metrics)


async def join(options, dashboard: bool, metrics: tuple[str, int] | None = None) -> int:
    from .daemon import Daemon

    daemon = Daemon(options)
    metrics_listener = None
    if metrics is not None:
        from ..metrics_http import open_metrics_listener

        metrics_listener = await open_metrics_listener(*metrics)  # a busy port: one line, before joining
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            nursery.start_soon(_watch_signals, signals, daemon)
            from .testnet import exit_with_parent

            nursery.start_soon(exit_with_parent, daemon.leave)
            await nursery.start(daemon.run)
            snap = daemon.snapshot()
            print(f"joined swarm {options.swarm.name!r} as {snap['peer_id']}", flush=True)
            for addr in snap["listen_addrs"][:4]:
                print(f"  listening on {addr}", flush=True)
            if options.node.uids:
                node = options.node
                print(f"  hosting {len(node.uids)} {node.expert_class} experts (hidden {node.hidden_dim}) on {daemon.device}", flush=True)
            elif options.node.place:
                hosted = sorted(snap_uid["uid"] for snap_uid in snap.get("experts", []))
                print(f"  placement: hosting {len(hosted)} grid experts on {daemon.device}: {', '.join(hosted[:8])}"
                      + (" …" if len(hosted) > 8 else ""), flush=True)
            print(f"  control socket {options.control_path}", flush=True)
            if metrics_listener is not None:
                from ..metrics_http import listener_address, serve_registry
                from .metrics import daemon_registry

                await nursery.start(serve_registry, metrics_listener, daemon_registry(daemon))
                host, port = listener_address(metrics_listener)
                print(f"  metrics on http://{host}:{port}/metrics", flush=True)
            if not dashboard:
                nursery.start_soon(_report_reachable, daemon)
            if dashboard:
                from .dashboard import LiveDashboard

                nursery.start_soon(LiveDashboard().run, daemon.snapshot)
            else:  # systemd's journal: a one-line summary every 5 minutes
                from .dashboard import log_summaries

                nursery.start_soon(log_summaries, daemon.snapshot)
            await daemon.wait_left()
            nursery.cancel_scope.cancel()
    handed = daemon.node.handed_off if daemon.node is not None else None
    if handed is not None:
        for uid, (peer, version) in sorted(handed.done.items()):
            print(f"  handed off {uid} (version {version}) to {peer[-10:]}", flush=True)
        for uid, why in sorted(handed.failed.items()):
            print(f"  could not hand off {uid}: {why} (its checkpoint keeps it)", flush=True)
    print("left the swarm: experts withdrawn, checkpoints saved", flush=True)
    return 0


async def _report_reachable(daemon) -> None:
    """One line once others can reach us (the dashboard shows it in its own place)."""
    await daemon.reachable.wait()
    print(f"  reachable after {daemon.reachable_after_s:.1f} s: {daemon.reachable_how}", flush=True)


async def _watch_signals(signals, daemon) -> None:
    count = 0
    async for _ in signals:
        count += 1
        if count == 1:
            print("leaving gracefully (press Ctrl-C again to quit at once)", file=sys.stderr, flush=True)
            daemon.leave()
        else:
            os._exit(130)  # the user asked twice: no more waiting on peers or checkpoints


def run_control(args: argparse.Namespace) -> int:
    path = args.control or default_control_path()
    cmd = args.control_cmd
    if cmd == "status":
        return run_status(args, path)
    reply = trio.run(request, path, "leave" if cmd == "stop" else cmd)
    print({"pause": "paused: experts withdrawn, new requests refused",
           "resume": "resumed: experts declared again",
           "stop": "the daemon is leaving the swarm"}[cmd])
    return 0 if reply.get("ok") else 1


def run_status(args: argparse.Namespace, path: Path) -> int:
    if args.json:
        print(json.dumps(trio.run(request, path, "status")["status"], indent=2))
        return 0
    if args.once or not sys.stdout.isatty():
        snapshot = trio.run(request, path, "status")["status"]
        from .dashboard import render_text

        width = os.get_terminal_size().columns if sys.stdout.isatty() else 100
        print(render_text(snapshot, width=width, height=200))
        return 0
    return trio.run(_live_status, path)


async def _live_status(path: Path) -> int:
    from .dashboard import LiveDashboard

    latest = (await request(path, "status"))["status"]

    async def poll() -> None:
        nonlocal latest
        while True:
            await trio.sleep(0.5)
            try:
                latest = (await request(path, "status"))["status"]
            except ControlError as exc:
                raise VolunteerError(f"lost the daemon: {exc}") from None

    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            nursery.start_soon(LiveDashboard().run, lambda: latest)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break
    return 0
