"""``volunteer join`` (the daemon) and the commands that talk to it: status, pause, resume, stop."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import trio

from ..errors import VolunteerError
from ..net.identity import load_or_create_keypair
from ..settings import JOIN_CHECKS
from ..swarmfile import (
    identity_path,
    load_config,
    load_limits,
    load_run,
    parse_experts_spec,
    resolve_swarm,
    state_dir,
    swarms_dir,
)
from .control import ControlError, DaemonLock, default_control_path, request
from .donorflags import add_donor_flags, choose_gpus, donor_choices
from ..web.serve import host_port_arg
from .netcmds import swarm_id_arg

JOIN_EXAMPLES = """\
examples:
  volunteer join demo                                   host what the swarm's [[grid]] needs most (else serve the DHT only)
  volunteer join demo --max-experts 4                   the same, at most 4 experts
  volunteer join demo --experts 'ffn:expert.[0:4].[0:8]'  host 32 experts of a 4x8 grid
  volunteer join ./myswarm.toml --experts 'transformer:block.[0:2]' --hidden-dim 1024 --device cuda:0
  volunteer join /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW... --swarm-id demo --no-dashboard
  volunteer join demo --web 127.0.0.1:7396              a local web page: live state, plots, fold/pause/finish
  volunteer join demo --when-idle 3 --pause-while steam --compute-hours 22:00-07:00
SWARM is a path to the swarm file its organiser gave you, a NAME saved as
<config dir>/swarms/NAME.toml, or a bootstrap multiaddr. Ctrl-C leaves gracefully (experts withdrawn, checkpoints saved); press it
again to quit at once. `volunteer status` shows the same dashboard from another terminal.
"""


def _setting(key: str):
    """The flag of ``key`` takes its value through the same check as config.toml's [join] and a
    swarm file's [experts] (a bad one is a usage error, exit 2, in the same words)."""
    check = JOIN_CHECKS[key]

    def parse(text: str):
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = key
    return parse


def _public_name(text: str) -> str:
    from ..dht.profile import check_public_name

    try:
        return check_public_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    p.add_argument("--experts", metavar="CLASS:PATTERN", help="experts to host, e.g. 'ffn:expert.[0:4].[0:8]' (default: the swarm "
                   "file's [experts].experts, else automatic placement on its [[grid]], else none)")
    p.add_argument("--max-experts", type=_setting("max_experts"), metavar="N", help="automatic placement hosts at most N experts "
                   "(default: what fits in --max-gpu-memory of the GPU, else 8 without a GPU; 0: route the DHT only)")
    # demos and tests of churn re-check placement more often than every 120 s
    p.add_argument("--recheck-period", type=float, metavar="S", help=argparse.SUPPRESS)
    p.add_argument("--hidden-dim", type=_setting("hidden_dim"), metavar="N", help="expert width (default: the swarm file's, else 64)")
    p.add_argument("--expert-file", metavar="FILE.py", help="a Python file that registers custom expert classes")
    p.add_argument("--device", help="auto (CUDA if present), cpu, cuda:0, … (default auto)")
    p.add_argument("--cpu-threads", type=_setting("cpu_threads"), metavar="N",
                   help="threads torch computes with on the CPU (default: every core)")
    p.add_argument("--max-batch", type=_setting("max_batch"), metavar="N", help="largest batch per expert call (default 1024)")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="settings file (default ~/.config/volunteer/config.toml): [join] device = \"cuda:0\", max_batch = 256, …")
    p.add_argument("--max-gpu-memory", type=_setting("max_gpu_memory"), metavar="FRACTION", help="cap torch's share of GPU memory, e.g. 0.5")
    p.add_argument("--max-ram", type=_setting("max_ram"), metavar="SIZE",
                   help="on the CPU, cap the memory the experts take, e.g. 8GiB: placement hosts what fits, and named "
                        "experts that do not fit are refused (default: what is available)")
    p.add_argument("--max-upload", type=_setting("max_upload"), metavar="RATE", help="cap everything this volunteer uploads (expert replies, replica sync, catch-up, hand-off), bytes/s (e.g. 5MiB)")
    p.add_argument("--listen", action="append", metavar="MULTIADDR", help="listen address (repeatable; default /ip4/0.0.0.0/tcp/0 and /ip4/0.0.0.0/udp/0/quic-v1, "
                   "and the same on /ip6/:: with a global IPv6 address)")
    p.add_argument("--name", type=_public_name, metavar="NAME",
                   help="a public name for the swarm's health page and its top contributors (default: not listed)")
    p.add_argument("--swarm-id", type=swarm_id_arg, help="swarm id when SWARM is a bare multiaddr (default: default)")
    p.add_argument("--identity", type=Path, metavar="PATH", help="identity key (default $VOLUNTEER_IDENTITY or ~/.config/volunteer/identity.key)")
    p.add_argument("--checkpoints", type=Path, metavar="DIR", help="checkpoint directory (default ~/.local/state/volunteer/checkpoints/SWARM)")
    p.add_argument("--share-tracebacks", choices=("full", "redacted", "none"), default=None,
                   help="what your expert errors show trainers: full tracebacks, redacted (paths relative "
                   "to the package or ~; the default), or none (type and message only)")
    p.add_argument("--no-dashboard", action="store_true", help="plain log lines, even in a terminal")
    p.add_argument("--metrics", type=host_port_arg, metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9101)")
    p.add_argument("--no-mdns", action="store_true",
                   help="do not look for volunteers of this swarm on the LAN (mDNS); also VOLUNTEER_NO_MDNS=1")
    p.add_argument("--no-port-mapping", action="store_true",
                   help="do not ask the home router to forward our ports (UPnP IGD, NAT-PMP, PCP); also "
                   "[join] port_mapping = false in the config, or VOLUNTEER_NO_PORT_MAPPING=1")
    add_control_flag(p)
    add_donor_flags(p)
    p.set_defaults(run=run_join)

    for name, helptext in (
        ("status", "show a running daemon's dashboard (or --json for scripts)"),
        ("fold", "start or resume serving: declare the experts and take calls (the first one records your consent)"),
        ("pause", "stop taking expert requests and withdraw the experts from the DHT"),
        ("resume", "the same as fold"),
        ("finish", "stop taking new calls, finish the running ones, hand off sole copies, save checkpoints, stay connected"),
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
    expert_class: str | None = None
    uids: list[str] = []
    if experts:
        expert_class, uids = parse_experts_spec(experts)
    max_experts = pick(getattr(args, "max_experts", None), "max_experts", None)
    replicas_config = None
    if getattr(args, "recheck_period", None):
        from ..replicas import ReplicasConfig

        replicas_config = ReplicasConfig(recheck_period=args.recheck_period)
    hidden = int(pick(args.hidden_dim, "hidden_dim", 64))
    donor = donor_choices(args, load_run(args.config))
    try:  # the schema's check, as for the file; one line (exit 1) like the other device errors
        device = JOIN_CHECKS["device"](pick(args.device, "device", "auto"))
    except ValueError as exc:
        raise VolunteerError(str(exc)) from None
    devices: list[str] = []
    if donor.gpus is not None or donor.exclude_gpus:
        import torch

        chosen = choose_gpus(torch.cuda.device_count() if torch.cuda.is_available() else 0, donor.gpus, donor.exclude_gpus)
        device, devices = f"cuda:{chosen[0]}", [f"cuda:{i}" for i in chosen] if len(chosen) > 1 else []
    keypair, _ = load_or_create_keypair(args.identity or identity_path())
    refuse_own_relay(spec, keypair.peer_id, args.identity or identity_path())
    node = VolunteerOptions(
        keypair=keypair,
        # TCP and QUIC on IPv4, and on IPv6 too when this machine has a global IPv6 address
        listen=pick(args.listen, "listen", default_listen_addrs()),
        expert_class=expert_class,
        uids=uids,
        hidden_dim=hidden,
        device=device,
        devices=devices,
        cpu_threads=pick(getattr(args, "cpu_threads", None), "cpu_threads", None),
        max_batch=int(pick(args.max_batch, "max_batch", 1024)),
        checkpoint_dir=args.checkpoints or state_dir() / "checkpoints" / spec.id,
        max_gpu_memory=pick(args.max_gpu_memory, "max_gpu_memory", None),
        max_ram=JOIN_CHECKS["max_ram"](ram) if (ram := pick(args.max_ram, "max_ram", None)) is not None else None,
        max_upload=pick(args.max_upload, "max_upload", None),
        expert_file=pick(args.expert_file, "expert_file", None),
        mdns=not args.no_mdns and settings.get("mdns", True) and os.environ.get("VOLUNTEER_NO_MDNS") != "1",
        stack=None if port_mapping_wanted(args, settings) else StackOptions(port_mapping=False),
        share_tracebacks=pick(args.share_tracebacks, "share_tracebacks", "redacted"),
        place=not uids and bool(spec.grids) and max_experts != 0,  # no experts named: the grid decides
        max_experts=max_experts,
        limits=load_limits(args.config),
        replicas_config=replicas_config,
        public_name=args.name,
    )
    from ..donor.probes import probe_from_env
    from ..donor.steward import POLICY_PERIOD

    period = args.policy_period if args.policy_period is not None else POLICY_PERIOD
    if not period > 0:
        raise VolunteerError("--policy-period must be positive")
    return DaemonOptions(swarm=spec, node=node, control_path=args.control or default_control_path(), state_dir=state_dir(),
                         policy=donor.policy, folding=donor.consent, probe=probe_from_env(), policy_period=period,
                         failure_limit=donor.failure_limit)


def refuse_own_relay(spec, peer_id, key_path) -> None:
    """A donor whose swarm names its own peer ID as a relay or bootstrap peer (a relay run with
    the donor's key on this machine) would reserve on itself and report it reachable: one line."""
    for addr in spec.entry_points:
        if addr.peer_id == peer_id:
            raise VolunteerError(
                f"swarm {spec.name!r} names this donor's own peer ID as a relay or bootstrap peer ({addr}): "
                f"a relay and a donor need keys of their own (the relay's default is relay.key); "
                f"run the relay without --identity {key_path}, or join with another --identity"
            )


def settle_consent(args: argparse.Namespace, options) -> None:
    """Consent first: with ``--yes`` or ``[run] consent = true`` the daemon folds; otherwise it
    shows what it will use and asks on a terminal, or starts paused with one line saying how to
    start. A yes at the prompt (or a later ``volunteer fold``) is recorded in config.toml."""
    from ..paths import config_file
    from . import consent

    path = Path(args.config) if args.config else config_file()
    recorded = [False]

    def remember(origin: str) -> None:
        if not recorded[0]:
            recorded[0] = consent.record(path)

    options.on_fold = remember
    if options.folding:  # --yes is said again at each start (a testnet's or a unit's); it is not recorded
        return
    web = None
    if getattr(args, "web", None):
        web = f"http://{args.web[0]}:{args.web[1] or '(a free port)'}/"
    lines = consent.summary_lines(options.node, policy_lines=options.policy.describe(), web=web)
    if sys.stdin.isatty() and sys.stdout.isatty():
        if consent.ask(lines):
            remember("consent")
            options.folding = True
            options.start_reason = "you agreed at the first start"
            return
        print(NOT_JOINED, flush=True)
    else:
        print("first start on this machine: volunteer will use", flush=True)
        for line in lines:
            print(f"  {line}", flush=True)
        print(NOT_JOINED + " (or join with --yes)", flush=True)
    # the daemon joins nothing and fetches nothing until a fold (Daemon.awaiting_consent)
    options.start_reason = "waiting for your consent: `volunteer fold` starts"


NOT_JOINED = "not joining yet: nothing is joined, downloaded or computed until you run `volunteer fold`"


def say_memory_estimate(options) -> None:
    """Print what the experts will take before any is built; refuse in one line when that is
    more than the memory allowed (``--max-gpu-memory`` of the GPU, or what is free)."""
    from .memory import estimate_for

    estimate = estimate_for(options.node, options.swarm.grids)
    if estimate is None:
        if options.node.expert_file:
            print("memory estimate: not known before --expert-file registers its classes", flush=True)
        return
    if not estimate.fits:
        raise VolunteerError(estimate.refusal())
    print(estimate.line(), flush=True)


def run_join(args: argparse.Namespace) -> int:
    options = build_options(args)
    # one lock decides whether a daemon already runs here: taken before anything else starts, so a
    # second `join` says so in one line and touches nothing of the first one's
    lock = DaemonLock(options.control_path).acquire() if options.control_path is not None else None
    settle_consent(args, options)
    metrics = getattr(args, "metrics", None)
    if options.node.uids or options.node.place:
        from ..experts.checkpoints import check_checkpoint_dir  # torch: only when hosting experts

        # found now, in one line (CheckpointDirError), not as a traceback when leaving with updates
        check_checkpoint_dir(options.node.checkpoint_dir)
        say_memory_estimate(options)
    dashboard = sys.stdout.isatty() and not args.no_dashboard
    if not dashboard:
        show_notices()
    # after show_notices: the event log lowers the root logger to INFO, and the terminal keeps
    # showing what it showed then (the notices' own level included)
    from .eventlog import event_log_path, open_event_log

    if options.state_dir is not None and open_event_log(event_log_path(options.state_dir)) is not None:
        options.log_file = event_log_path(options.state_dir)
    return trio.run(join, options, dashboard, metrics, getattr(args, "web", None), lock)


NOTICES = "volunteer.donor.steward"  # the donor's own actions (fold, pause, finish, by hand or by policy)


def show_notices() -> None:
    """Without the dashboard (a service, the journal), the steward's notices print at INFO even
    without -v: they say what the daemon did, and warnings stay for problems. The dashboard says
    the current one in its header (its Log panel keeps warnings only)."""
    import logging

    notices = logging.getLogger(NOTICES)
    if notices.getEffectiveLevel() > logging.INFO:
        notices.setLevel(logging.INFO)


async def join(options, dashboard: bool, metrics: tuple[str, int] | None = None, web: tuple[str, int] | None = None,
               lock: DaemonLock | None = None) -> int:
    from ..web.serve import open_web_socket
    from .daemon import Daemon

    daemon = Daemon(options, control_lock=lock)
    if daemon.awaiting_consent:  # nothing is dialled before a fold, but what is wrong here is said now, not then
        check_before_consent(options.node)
    metrics_sock = web_sock = None
    if metrics is not None:  # busy ports: one line each, before joining
        metrics_sock = open_web_socket(*metrics, flag="--metrics", what="metrics")
    token = ""
    if web is not None:
        from .webserve import web_token

        token = web_token()  # a token file that cannot be read or written: one line, before joining
        web_sock = open_web_socket(*web, flag="--web")
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            nursery.start_soon(_watch_signals, signals, daemon)
            from .testnet import exit_with_parent

            nursery.start_soon(exit_with_parent, daemon.leave)
            await nursery.start(daemon.run)
            if daemon.node is not None:
                _say_joined(daemon, options)
            else:  # no consent yet: the socket and the page answer, `fold` joins
                print(f"  waiting for your consent to join swarm {options.swarm.name!r}: `volunteer fold` joins", flush=True)
                nursery.start_soon(_say_joined_later, daemon, options)
            if metrics_sock is not None:
                from .webserve import serve_metrics

                print(f"  metrics on {await serve_metrics(nursery, daemon, metrics_sock)}/metrics", flush=True)
            if web_sock is not None:
                from .webserve import is_loopback, lan_names, serve_page

                print(f"  web page on {await serve_page(nursery, daemon, web_sock, token)} (the link holds this machine's token)",
                      flush=True)
                bound = web_sock.getsockname()[0]
                if not is_loopback(bound):
                    lan = [name for name in lan_names(bound) if not name.startswith(("127.", "[::1]"))]
                    where = f" (from the LAN: {', '.join(f'http://{n}:{web_sock.getsockname()[1]}/' for n in lan[:3])})" if lan else ""
                    print(f"  note: the web page listens beyond this machine{where}; only the token keeps others out",
                          flush=True)
            if options.log_file is not None:
                print(f"  event log {options.log_file}", flush=True)
            print(f"  control socket {options.control_path}", flush=True)  # the last line of the start
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
    for line in farewell_lines(handed, daemon.snapshot(), joined=daemon.node is not None):
        print(line, flush=True)
    return 0


def farewell_lines(handed, snapshot: dict, *, joined: bool) -> list[str]:
    """What ``join`` prints as it exits: each expert handed off (to whom, in the one short form of
    a peer ID) or not, how it left, and what this session gave: calls, samples, uptime, bytes."""
    from ..sizes import format_size
    from ..widgets import duration, short

    lines = []
    if handed is not None:
        lines += [f"  handed off {uid} (version {version}) to {short(peer)}" for uid, (peer, version) in sorted(handed.done.items())]
        lines += [f"  could not hand off {uid}: {why} (its checkpoint keeps it)" for uid, why in sorted(handed.failed.items())]
    if not joined:
        return lines + ["stopped: never joined the swarm (no consent given)"]
    lines.append("left the swarm: experts withdrawn, checkpoints saved")
    session = (snapshot.get("contributions") or {}).get("session") or {}
    trainers = int(session.get("trainers") or 0)
    lines.append(
        f"this session: {duration(snapshot.get('uptime_s'))} up, {int(session.get('requests') or 0):,} calls, "
        f"{int(session.get('samples') or 0):,} samples for {trainers} trainer{'' if trainers == 1 else 's'}, "
        f"{format_size(int(session.get('bytes_sent') or 0))} sent"
    )
    return lines


def check_before_consent(node) -> None:
    """What ``open_volunteer`` would refuse on this machine alone (a device it lacks, a port
    taken), checked before a daemon waits for consent, so the error is one line now and not after
    the donor's fold."""
    from ..node import check_device

    if node.hosts_experts and node.experts_config is None:
        for device in [node.device, *node.devices]:
            check_device(device, node.max_gpu_memory)
    check_listen_ports(node.listen)


def check_listen_ports(listen) -> None:
    """ListenError in one line (the Host's words) when a fixed TCP or UDP port of ``listen`` is
    taken: a daemon waiting for consent opens its listeners only once the donor folds."""
    import errno
    import socket

    from ..errors import ListenError
    from ..net.multiaddr import Multiaddr

    for text in listen:
        addr = Multiaddr(text)
        host = addr.value_for("ip4") or addr.value_for("ip6")
        for kind, proto in (("tcp", socket.SOCK_STREAM), ("udp", socket.SOCK_DGRAM)):
            port = addr.value_for(kind)
            if host is None or not port or int(port) == 0:
                continue
            family = socket.AF_INET6 if addr.value_for("ip6") else socket.AF_INET
            with socket.socket(family, proto) as sock:
                if proto == socket.SOCK_STREAM:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listener will
                try:
                    sock.bind((host, int(port)))
                except OSError as exc:
                    reason = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
                    raise ListenError(f"cannot listen on {addr}: {reason}") from None


def _say_joined(daemon, options) -> None:
    """The lines of a join: who we are, where we listen, what we host."""
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
    if not daemon.conduct.serving:
        print(f"  {daemon.conduct.text}", flush=True)


async def _say_joined_later(daemon, options) -> None:
    """The join's lines once the donor's fold let the daemon join."""
    await daemon.joined.wait()
    _say_joined(daemon, options)


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
    if cmd == "stop":
        print("the daemon is leaving the swarm")
    else:
        print({"pause": "paused: experts withdrawn, new requests refused; `volunteer fold` resumes",
               "fold": "folding: experts declared, taking calls", "resume": "folding: experts declared, taking calls",
               "finish": "finishing: no new calls; running ones finish, sole copies are handed off, checkpoints "
                         "saved, then idle and connected"}[cmd])
        if reply.get("text") and not reply.get("text", "").startswith(("folding", "finishing", "paused by you")):
            print(f"now: {reply['text']}")  # a policy or self-care still holds it back
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
