"""A network-namespace NAT rig: home routers, a carrier-grade NAT, a public "internet", delays.

Protocol-agnostic: it builds namespaces, veths, bridges and nftables NAT rules from a small
declarative ``Spec``, then runs arbitrary commands inside the namespaces. Everything lives in
namespaces named ``vr<pid><letter>-<node>``; the root namespace is never touched (veths are
created directly inside their namespaces). Only documentation and shared address space is used
(192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 100.64.0.0/10) and no namespace has a route to
anything else.

    with Rig(easy_pair()) as rig:
        rig.run("peer_a", ["python", "-c", "..."])
        rig.public_addr_of("peer_a")   # router WAN IP

By hand: ``python -m tests.nat.rig --help`` (see tests/nat/README.md). Needs root.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tests.nat.lines import DATACENTER, PROFILES, Link, cap_command, caps_of
from tests.nat.netns import (  # noqa: F401  (re-exported: tests and benchmarks use them from here)
    CMD_TIMEOUT,
    NS_RE,
    TABLE,
    _cmd,
    _delete_ns,
    _pid_alive,
    _terminate,
    cleanup_stale,
    list_namespaces,
    read_line,
    unusable_reason,
)

REPO = Path(__file__).resolve().parents[2]
DELAYER = Path(__file__).with_name("delayer.py")
ALLOWED = tuple(
    ipaddress.ip_network(n)
    for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "100.64.0.0/10")
)
INTERNET = ipaddress.ip_network("203.0.113.0/24")
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,19}$")
RESERVED = ("internet", "wire")
NATS = ("eim", "symmetric")
READY_TIMEOUT = 10.0  # a delayer must say "ready" within this
MAX_NODES = 64
SETTLE_TIMEOUT = 10.0  # links must be operationally up within this


# ---------------------------------------------------------------- spec


@dataclasses.dataclass(frozen=True)
class Router:
    """A NAT router: WAN leg on the internet (or on ``upstream``'s LAN), LAN bridge behind it.

    ``nat``: "eim" (masquerade: endpoint-independent mapping, keeps ports when it can) or
    "symmetric" (masquerade random,fully-random: a fresh random port per new 5-tuple).
    ``wan`` is picked from the upstream segment when None. ``link`` impairs the WAN leg.
    ``unsolicited_tcp``: "drop" (silently, as most home routers) or "reset" (answer a SYN
    nobody asked for with a RST, as some NAT boxes do; unsolicited UDP is still dropped).
    """

    name: str
    lan: str
    nat: str = "eim"
    wan: str | None = None
    upstream: str | None = None
    link: Link | None = None
    unsolicited_tcp: str = "drop"


@dataclasses.dataclass(frozen=True)
class Host:
    """A host: behind ``router`` (default route via it) or, when None, on the internet.

    ``addrs``: first is primary; picked from the router's LAN when empty (behind a router).
    """

    name: str
    router: str | None = None
    addrs: tuple[str, ...] = ()
    link: Link | None = None


@dataclasses.dataclass(frozen=True)
class Spec:
    """A whole scenario. Routers must be listed after their upstream."""

    routers: tuple[Router, ...] = ()
    hosts: tuple[Host, ...] = ()


PUBLIC = (
    Host("relay", addrs=("203.0.113.10",)),
    Host("public", addrs=("203.0.113.20",)),
    Host("observer", addrs=("203.0.113.30", "203.0.113.31")),
)


def _link(delay_ms: float, jitter_ms: float, loss_pct: float) -> Link | None:
    return Link(delay_ms, jitter_ms, loss_pct) if (delay_ms or jitter_ms or loss_pct) else None


def easy_pair(delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0) -> Spec:
    """peer_a behind EIM nat_a, peer_b behind EIM nat_b, relay/public/observer on the internet.

    Delay/jitter/loss (per direction) go on both home routers' WAN links.
    """
    return _pair("eim", delay_ms, jitter_ms, loss_pct)


def symmetric_pair(delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0) -> Spec:
    """Like easy_pair, but nat_a is symmetric (endpoint-dependent mapping)."""
    return _pair("symmetric", delay_ms, jitter_ms, loss_pct)


def _pair(nat_a: str, delay_ms: float, jitter_ms: float, loss_pct: float) -> Spec:
    link = _link(delay_ms, jitter_ms, loss_pct)
    return Spec(
        routers=(
            Router("nat_a", "192.0.2.0/26", nat_a, "203.0.113.101", link=link),
            Router("nat_b", "192.0.2.64/26", "eim", "203.0.113.102", link=link),
        ),
        hosts=(Host("peer_a", "nat_a", ("192.0.2.2",)), Host("peer_b", "nat_b", ("192.0.2.66",)))
        + PUBLIC,
    )


def double_nat_pair(
    delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0, cgnat: str = "eim"
) -> Spec:
    """peer_a behind home nat_a behind carrier NAT isp_a (100.64.0.0/24); peer_b behind nat_b."""
    link = _link(delay_ms, jitter_ms, loss_pct)
    return Spec(
        routers=(
            Router("isp_a", "100.64.0.0/24", cgnat, "203.0.113.111"),
            Router("nat_a", "192.0.2.0/26", "eim", "100.64.0.2", upstream="isp_a", link=link),
            Router("nat_b", "192.0.2.64/26", "eim", "203.0.113.102", link=link),
        ),
        hosts=(Host("peer_a", "nat_a", ("192.0.2.2",)), Host("peer_b", "nat_b", ("192.0.2.66",)))
        + PUBLIC,
    )


def rst_pair(delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0, both: bool = False) -> Spec:
    """Like easy_pair, but nat_a (and nat_b too when ``both``) answers unsolicited inbound TCP
    with a RST instead of dropping it (unsolicited UDP is dropped as everywhere)."""
    link = _link(delay_ms, jitter_ms, loss_pct)
    return Spec(
        routers=(
            Router("nat_a", "192.0.2.0/26", "eim", "203.0.113.101", link=link, unsolicited_tcp="reset"),
            Router("nat_b", "192.0.2.64/26", "eim", "203.0.113.102", link=link,
                   unsolicited_tcp="reset" if both else "drop"),
        ),
        hosts=(Host("peer_a", "nat_a", ("192.0.2.2",)), Host("peer_b", "nat_b", ("192.0.2.66",)))
        + PUBLIC,
    )


def homes(line: str, names: Sequence[str], nat: str | dict[str, str] = "eim",
          queue_ms: float = 100.0) -> Spec:
    """One home per name, each on a ``line`` (``lines.PROFILES``: caps, delay, loss): host
    ``name`` (198.51.100.x) behind router ``nat_<name>``; plus ``relay`` (203.0.113.10) in a
    datacenter 10 ms from the internet and ``public`` (203.0.113.20) on it. ``nat``: one NAT
    type for every home, or one per name (missing names get "eim")."""
    if not 1 <= len(names) <= 8:
        raise ValueError("homes: 1 to 8 homes")
    link = PROFILES[line].link(queue_ms)
    kinds = {n: (nat if isinstance(nat, str) else nat.get(n, "eim")) for n in names}
    return Spec(
        routers=tuple(Router(f"nat_{n}", f"198.51.100.{32 * i}/27", kinds[n], link=link)
                      for i, n in enumerate(names)),
        hosts=tuple(Host(n, f"nat_{n}") for n in names)
        + (Host("relay", addrs=("203.0.113.10",), link=DATACENTER), Host("public", addrs=("203.0.113.20",))),
    )


SPECS = {"easy": easy_pair, "symmetric": symmetric_pair, "double": double_nat_pair, "rst": rst_pair}


def _allowed(addr: str) -> ipaddress.IPv4Address:
    ip = ipaddress.ip_address(addr)
    if not any(ip in n for n in ALLOWED):
        raise ValueError(f"{addr} is outside the rig's allowed ranges")
    return ip


@dataclasses.dataclass
class _Segment:
    """An L2 segment: a bridge in some namespace, its network and (behind a router) gateway."""

    ns: str
    bridge: str
    net: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address | None
    used: set = dataclasses.field(default_factory=set)

    def take(self, addr: str | None, first: int) -> ipaddress.IPv4Address:
        """Reserve ``addr`` (checked) or the next free host address from offset ``first``."""
        if addr is None:
            free = (h for h in itertools.islice(self.net.hosts(), first - 1, None))
            ip = next((h for h in free if h not in self.used), None)
            if ip is None:
                raise ValueError(f"segment {self.net} is full")
        else:
            ip = _allowed(addr)
            if ip not in self.net or ip in self.used or ip in (self.net.network_address,
                                                                 self.net.broadcast_address):
                raise ValueError(f"{addr} is not a free host address in {self.net}")
        self.used.add(ip)
        return ip


def _check(spec: Spec) -> None:
    names = [r.name for r in spec.routers] + [h.name for h in spec.hosts]
    if len(names) > MAX_NODES:
        raise ValueError(f"at most {MAX_NODES} nodes")
    for n in names:
        if not NAME_RE.match(n) or n in RESERVED:
            raise ValueError(f"bad node name {n!r}")
    if len(set(names)) != len(names):
        raise ValueError("node names must be unique")
    for r in spec.routers:
        if r.nat not in NATS:
            raise ValueError(f"{r.name}: nat must be one of {NATS}")
        if r.unsolicited_tcp not in ("drop", "reset"):
            raise ValueError(f"{r.name}: unsolicited_tcp must be 'drop' or 'reset'")
        if not any(ipaddress.ip_network(r.lan).subnet_of(n) for n in ALLOWED):
            raise ValueError(f"{r.name}: LAN {r.lan} outside the allowed ranges")
    for a in [r.wan for r in spec.routers if r.wan] + [a for h in spec.hosts for a in h.addrs]:
        _allowed(a)
    for x in list(spec.routers) + list(spec.hosts):
        problems = x.link.problems() if x.link else []
        if problems:
            raise ValueError(f"{x.name}: link values out of range: {'; '.join(problems)}")


# ---------------------------------------------------------------- the rig


_live: set["Rig"] = set()
_letters = itertools.cycle("abcdefghijklmnopqrstuvwxy")  # z is the probe's
_lock = threading.Lock()


@atexit.register
def _down_all() -> None:
    for rig in list(_live):
        rig.down()


class Rig:
    """A running (after ``up()``) instance of a Spec; a context manager.

    Namespaces are ``{tag}-{node}``, with ``tag`` = ``vr<pid><letter>``; interfaces inside
    them are ``{iftag}-...`` (at most 15 chars). ``down()`` is idempotent and also runs at exit.
    """

    def __init__(self, spec: Spec) -> None:
        _check(spec)
        self.spec = spec
        pid = os.getpid()
        with _lock:  # skip letters still held by a live rig of this process
            taken = {n.split("-", 1)[0] for n in list_namespaces()}
            letter = next((x for x in itertools.islice(_letters, 25)
                           if f"vr{pid}{x}" not in taken), None)
        if letter is None:
            raise RuntimeError("25 rigs are already up in this process")
        self.tag = f"vr{pid}{letter}"
        self.iftag = f"vr{pid % 10000:04d}{letter}"
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self._addrs: dict[str, list[str]] = {}
        self._up: dict[str, str | None] = {}  # node -> router it sits behind (or None)
        self._segs: dict[str, _Segment] = {}
        self._ports = itertools.count()
        self._nodes = {x.name: x for x in list(spec.routers) + list(spec.hosts)}
        self._capped: dict[str, dict[str, tuple[str, str]]] = {}  # node -> up/down -> (ns, dev)

    # ---- lifecycle

    def __enter__(self) -> "Rig":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> "Rig":
        """Build every namespace, link, address, route, NAT rule and delayer; return self."""
        if self.namespaces:
            raise RuntimeError(f"rig {self.tag} is already up")
        _live.add(self)
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Kill tracked processes, delete every namespace of this rig. Safe to call twice."""
        procs, self.procs = self.procs, []
        for p in procs:
            _terminate(p)
        for ns in reversed(self.namespaces):
            _delete_ns(ns)
        self.namespaces = []
        _live.discard(self)

    # ---- queries

    def ns(self, node: str) -> str:
        """The namespace name of a node."""
        if node not in self._nodes and node not in RESERVED:
            raise KeyError(node)
        return f"{self.tag}-{node}"

    def addr(self, node: str) -> str:
        """Primary address of a node (a router's: its WAN address)."""
        return self._addrs[node][0]

    def addrs(self, node: str) -> list[str]:
        """All addresses of a host (a router: WAN, then LAN gateway)."""
        return list(self._addrs[node])

    def public_addr_of(self, node: str) -> str:
        """The address the internet sees for this node: the outermost router's WAN address."""
        cur, hops = node, 0
        while self._up.get(cur) is not None and hops < MAX_NODES:
            cur, hops = self._up[cur], hops + 1
        return self.addr(cur)

    # ---- running things

    def _argv(self, node: str, argv: Sequence[str] | str) -> list[str]:
        if isinstance(argv, str):
            argv = ["sh", "-c", argv]
        return ["ip", "netns", "exec", self.ns(node), *argv]

    def run(self, node: str, argv: Sequence[str] | str, timeout: float = CMD_TIMEOUT,
            check: bool = False, **kw) -> subprocess.CompletedProcess:
        """Run a command in the node's namespace (text, captured output, cwd = repo root).

        A string is run with ``sh -c``. Extra keywords go to ``subprocess.run``.
        """
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("cwd", REPO)
        return subprocess.run(self._argv(node, argv), timeout=timeout, check=check, **kw)

    def popen(self, node: str, argv: Sequence[str] | str, **kw) -> subprocess.Popen:
        """Start a command in the node's namespace; tracked and killed (its group) at down().

        Defaults: own session (so its children die with it), cwd = repo root. Extra keywords
        go to ``subprocess.Popen``; use ``read_line`` on ``stdout=PIPE`` to wait for output.
        """
        kw.setdefault("start_new_session", True)
        kw.setdefault("cwd", REPO)
        p = subprocess.Popen(self._argv(node, argv), **kw)
        self.procs.append(p)
        return p

    def ping(self, node: str, dst: str, count: int = 5, interval: float = 0.2) -> list[float]:
        """ICMP echo RTTs in ms from node to dst (lost probes omitted); ping(8) or Python."""
        count = max(1, min(count, 100))
        if shutil.which("ping"):
            p = self.run(node, ["ping", "-n", "-c", str(count), "-i", str(interval),
                                "-W", "2", dst], timeout=count * (interval + 2) + 5)
            return [float(x) for x in re.findall(r"time=([\d.]+) ms", p.stdout)]
        p = self.run(node, [sys.executable, "-c", _PING, dst, str(count), str(interval)],
                     timeout=count * (interval + 2) + 5)
        return [float(x) for x in p.stdout.split()]

    def conntrack(self, router: str) -> list[str]:
        """The router's conntrack table (lines of /proc/net/nf_conntrack)."""
        return self.run(router, ["cat", "/proc/net/nf_conntrack"], check=True).stdout.splitlines()

    def dropped(self, router: str) -> int:
        """Packets the router's firewall dropped so far (sum of its drop-rule counters)."""
        out = self.run(router, ["nft", "-j", "list", "table", "ip", TABLE], check=True).stdout
        total = 0
        for item in json.loads(out).get("nftables", []):
            for e in item.get("rule", {}).get("expr", []):
                if "counter" in e:
                    total += e["counter"]["packets"]
        return total

    def caps(self, node: str) -> dict[str, list[dict]]:
        """The tbf caps in force on a node's link: ``{"up": [...], "down": [...]}`` (see
        ``lines.caps_of``); empty lists for a direction without a cap."""
        where = self._capped.get(node, {})
        return {d: caps_of(*where[d]) if d in where else [] for d in ("up", "down")}

    def forward_port(self, router: str, port: int, host: str, proto: str = "tcp") -> None:
        """Open ``port`` on the router's WAN address to ``host`` behind it (a user's port forward):
        new connections to WAN:port reach host:port; everything else stays dropped."""
        if not 0 < port < 65536 or proto not in ("tcp", "udp"):
            raise ValueError(f"bad port forward {proto}/{port}")
        if self._up.get(host) != router:
            raise ValueError(f"{host} is not behind {router}")
        wan, target = f"{self.iftag}-wan", self.addr(host)
        rules = (f"add chain ip {TABLE} prerouting {{ type nat hook prerouting priority dstnat; }}\n"
                 f'add rule ip {TABLE} prerouting iifname "{wan}" {proto} dport {port} dnat to {target}\n'
                 f'insert rule ip {TABLE} forward iifname "{wan}" ip daddr {target} {proto} dport {port} '
                 f"ct status dnat accept\n")
        _cmd(["ip", "netns", "exec", self.ns(router), "nft", "-f", "-"], input=rules)

    def describe(self) -> str:
        """A table: node, namespace, addresses, public address."""
        rows = [f"{'node':10} {'namespace':24} {'addresses':32} public"]
        for name in self._nodes:
            rows.append(f"{name:10} {self.ns(name):24} {','.join(self._addrs.get(name, [])):32} "
                        f"{self.public_addr_of(name) if name in self._addrs else '?'}")
        return "\n".join(rows)

    # ---- building

    def _add_ns(self, name: str, router: bool = False) -> str:
        ns = f"{self.tag}-{name}"
        _cmd(["ip", "netns", "add", ns])
        self.namespaces.append(ns)
        _cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
        ctl = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
        if router:
            ctl.append("net.ipv4.ip_forward=1")
        _cmd(["ip", "netns", "exec", ns, "sysctl", "-q", "-e", "-w", *ctl])
        return ns

    def _bridge(self, ns: str, name: str) -> str:
        br = f"{self.iftag}-{name}"
        _cmd(["ip", "-n", ns, "link", "add", br, "type", "bridge"])
        _cmd(["ip", "-n", ns, "link", "set", br, "up"])
        return br

    def _attach(self, ns: str, ifname: str, seg: _Segment, link: Link | None) -> None:
        """Plug interface ``ifname`` of ``ns`` into a segment, through a delayer if ``link``."""
        i = next(self._ports)
        port = f"{self.iftag}-p{i}"
        if link is None or not link.delays:
            _cmd(["ip", "-n", ns, "link", "add", ifname, "type", "veth",
                  "peer", "name", port, "netns", seg.ns])
        else:
            wire = f"{self.tag}-wire"
            if wire not in self.namespaces:
                self._add_ns("wire")
            wa, wb = f"{self.iftag}-w{i}a", f"{self.iftag}-w{i}b"
            _cmd(["ip", "-n", ns, "link", "add", ifname, "type", "veth",
                  "peer", "name", wa, "netns", wire])
            _cmd(["ip", "-n", wire, "link", "add", wb, "type", "veth",
                  "peer", "name", port, "netns", seg.ns])
            for w in (wa, wb):
                _cmd(["ip", "-n", wire, "link", "set", w, "promisc", "on", "up"])
            p = self.popen("wire", [sys.executable, str(DELAYER), "--a", wa, "--b", wb,
                                    "--delay-ms", str(link.delay_ms),
                                    "--jitter-ms", str(link.jitter_ms),
                                    "--loss-pct", str(link.loss_pct)]
                           + (["--verbose"] if os.environ.get("RIG_DELAYER_VERBOSE") else []),
                           stdout=subprocess.PIPE)
            if read_line(p, READY_TIMEOUT).strip() != "ready":
                raise RuntimeError(f"delayer on {wa}/{wb} did not start")
        _cmd(["ip", "-n", seg.ns, "link", "set", port, "master", seg.bridge, "up"])
        _cmd(["ip", "-n", ns, "link", "set", ifname, "up"])
        if link is not None:
            self._cap(ns, ifname, seg.ns, port, link)

    def _cap(self, ns: str, ifname: str, up_ns: str, port: str, link: Link) -> None:
        """Install a link's caps: the uplink on ``ifname`` (egress towards the upstream segment),
        the downlink on the segment's ``port`` (egress towards ``ns``); both before the delayer."""
        node = ns.split("-", 1)[1]
        self._capped[node] = {"up": (ns, ifname), "down": (up_ns, port)}
        for (where, dev), mbit in ((self._capped[node]["up"], link.up_mbit),
                                   (self._capped[node]["down"], link.down_mbit)):
            if mbit is not None:
                _cmd(cap_command(where, dev, mbit, link.queue_ms))

    def _build(self) -> None:
        inet = self._add_ns("internet")
        self._segs["internet"] = _Segment(inet, self._bridge(inet, "br"), INTERNET, None)
        for r in self.spec.routers:
            if r.upstream is not None and r.upstream not in self._segs:
                raise ValueError(f"{r.name}: upstream {r.upstream!r} must be a router listed first")
            up = self._segs[r.upstream or "internet"]
            wan = up.take(r.wan, 101 if r.upstream is None else 2)
            ns = self._add_ns(r.name, router=True)
            lan_net = ipaddress.ip_network(r.lan)
            gw = next(lan_net.hosts())
            seg = _Segment(ns, self._bridge(ns, "lan"), lan_net, gw, {gw})
            self._segs[r.name] = seg
            wif = f"{self.iftag}-wan"
            self._attach(ns, wif, up, r.link)
            _cmd(["ip", "-n", ns, "addr", "add", f"{wan}/{up.net.prefixlen}", "dev", wif])
            _cmd(["ip", "-n", ns, "addr", "add", f"{gw}/{lan_net.prefixlen}", "dev", seg.bridge])
            if up.gateway is not None:
                _cmd(["ip", "-n", ns, "route", "add", "default", "via", str(up.gateway)])
            _cmd(["ip", "netns", "exec", ns, "nft", "-f", "-"],
                 input=_ruleset(r.nat, wif, seg.bridge, r.unsolicited_tcp))
            self._addrs[r.name] = [str(wan), str(gw)]
            self._up[r.name] = r.upstream
        for h in self.spec.hosts:
            if h.router is not None and h.router not in self._segs:
                raise ValueError(f"{h.name}: unknown router {h.router!r}")
            seg = self._segs[h.router or "internet"]
            if h.router is None and not h.addrs:
                raise ValueError(f"{h.name}: a public host needs explicit addrs")
            ips = [seg.take(a, 2) for a in h.addrs] or [seg.take(None, 2)]
            ns = self._add_ns(h.name)
            eth = f"{self.iftag}-eth0"
            self._attach(ns, eth, seg, h.link)
            for ip in ips:
                _cmd(["ip", "-n", ns, "addr", "add", f"{ip}/{seg.net.prefixlen}", "dev", eth])
            if seg.gateway is not None:
                _cmd(["ip", "-n", ns, "route", "add", "default", "via", str(seg.gateway)])
            self._addrs[h.name] = [str(ip) for ip in ips]
            self._up[h.name] = h.router
        self._settle()

    def _settle(self) -> None:
        """Wait until every link is operationally up with a real qdisc.

        The kernel applies carrier changes (veth peer up, bridge port forwarding, the qdisc
        that replaces the frame-dropping noop one) from linkwatch, up to ~1 s later; frames
        sent before that vanish, which made the first ARP through a fresh rig time out.
        """
        end = time.monotonic() + SETTLE_TIMEOUT
        pending = list(self.namespaces)
        while pending:
            ns = pending[0]
            lines = _cmd(["ip", "-n", ns, "-o", "link", "show"]).splitlines()
            if all("state UP" in x and "qdisc noop" not in x for x in lines if ": lo:" not in x):
                pending.pop(0)
                continue
            if time.monotonic() > end:
                raise RuntimeError(f"links in {ns} not up after {SETTLE_TIMEOUT} s: {lines}")
            time.sleep(0.05)


def _ruleset(nat: str, wan: str, lan: str, unsolicited_tcp: str = "drop") -> str:
    """nftables rules of a home/carrier router: NAT out of WAN, drop unsolicited from WAN.

    Drops are silent (no reject, so no RST/ICMP) and counted; the input chain also drops new
    traffic to the router's own WAN address, so the router never answers for itself. With
    ``unsolicited_tcp="reset"`` a new TCP connection to the WAN address (a SYN that matches no
    mapping) is answered with a RST instead, counted too.
    """
    flags = " random,fully-random" if nat == "symmetric" else ""
    reset = f'iifname "{wan}" meta l4proto tcp counter reject with tcp reset\n    ' if unsolicited_tcp == "reset" else ""
    return f"""
table ip {TABLE} {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "{wan}" masquerade{flags}
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    ct state invalid counter drop
    ct state established,related accept
    iifname "{lan}" oifname "{wan}" accept
    counter drop
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname "{wan}" ct state established,related accept
    {reset}iifname "{wan}" counter drop
  }}
}}
"""


# Echo requests over a raw socket, for machines without ping(8). Prints one RTT (ms) per reply.
_PING = r"""
import os, select, socket, struct, sys, time
dst, count, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
ident = os.getpid() & 0xFFFF
def csum(b):
    b += b"\0" * (len(b) & 1)
    t = sum(struct.unpack(f"!{len(b)//2}H", b)); t = (t >> 16) + (t & 0xFFFF); t += t >> 16
    return ~t & 0xFFFF
for seq in range(count):
    body = struct.pack("!d", time.monotonic()) + b"rig" * 8
    hdr = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    pkt = struct.pack("!BBHHH", 8, 0, csum(hdr + body), ident, seq) + body
    t0 = time.monotonic(); s.sendto(pkt, (dst, 0)); end = t0 + 2.0
    while (left := end - time.monotonic()) > 0:
        if not select.select([s], [], [], left)[0]:
            break
        data = s.recv(65535); ihl = (data[0] & 15) * 4
        typ, _, _, i, q = struct.unpack("!BBHHH", data[ihl:ihl + 8])
        if typ == 0 and i == ident and q == seq:
            print(round((time.monotonic() - t0) * 1000, 3), flush=True); break
    time.sleep(max(0.0, interval - (time.monotonic() - t0)))
"""


# ---------------------------------------------------------------- command line


def _find(node: str, tag: str | None) -> str:
    found = [n for n in list_namespaces()
             if (m := NS_RE.match(n)) and m.group(3) == node and _pid_alive(int(m.group(1)))
             and (tag is None or n.startswith(tag + "-"))]
    if len(found) != 1:
        raise SystemExit(f"need exactly one live namespace for {node!r}, found {found} "
                         "(use --rig TAG)")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    """``up`` a scenario and hold it; ``exec`` in a node of a live rig; ``list``; ``cleanup``."""
    p = argparse.ArgumentParser(prog="python -m tests.nat.rig", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="bring a scenario up and hold it until Ctrl-C / SIGTERM")
    u.add_argument("scenario", choices=sorted(SPECS) + ["homes"],
                   help="homes: --homes N homes (home0, home1, ...) on the --line profile")
    u.add_argument("--line", choices=sorted(PROFILES), default="cable", help="homes: line profile")
    u.add_argument("--homes", type=int, default=2, help="homes: how many")
    u.add_argument("--delay-ms", type=float, default=0.0, help="per direction, home WAN links")
    u.add_argument("--jitter-ms", type=float, default=0.0)
    u.add_argument("--loss-pct", type=float, default=0.0)
    u.add_argument("--hold", type=float, default=3600.0, help="tear down after this many s")
    e = sub.add_parser("exec", help="run a command in NODE of the live rig: exec NODE -- CMD")
    e.add_argument("node")
    e.add_argument("--rig", help="rig tag (vr<pid><letter>) when several are live")
    e.add_argument("argv", nargs=argparse.REMAINDER)
    sub.add_parser("list", help="list the rig namespaces on this machine")
    sub.add_parser("cleanup", help="delete rig namespaces whose creating process is dead")
    a = p.parse_args(argv)
    if a.cmd == "list":
        for n in list_namespaces():
            alive = _pid_alive(int(NS_RE.match(n).group(1)))
            print(n, "" if alive else "(stale)")
        return 0
    if a.cmd == "cleanup":
        for n in cleanup_stale():
            print("deleted", n)
        return 0
    if a.cmd == "exec":
        cmd = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
        os.execvp("ip", ["ip", "netns", "exec", _find(a.node, a.rig), *(cmd or ["sh"])])
    reason = unusable_reason()
    if reason:
        raise SystemExit(reason)
    cleanup_stale()

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    if a.scenario == "homes":
        spec = homes(a.line, [f"home{i}" for i in range(max(1, min(a.homes, 8)))])
    else:
        spec = SPECS[a.scenario](a.delay_ms, a.jitter_ms, a.loss_pct)
    with Rig(spec) as rig:
        print(rig.describe())
        print(f"\nrig {rig.tag} up; try: python -m tests.nat.rig exec peer_a -- "
              f"ip route\nCtrl-C (or SIGTERM to pid {os.getpid()}) tears it down.", flush=True)
        try:
            time.sleep(max(0.0, min(a.hold, 86400.0)))
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
