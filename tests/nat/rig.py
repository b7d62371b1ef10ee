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
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tests.nat import homes as home_routers
from tests.nat.lines import PROFILES, Link, cap_command, caps_of
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
from tests.nat.specs import (  # noqa: F401  (re-exported: tests and benchmarks import them from here)
    ALLOWED,
    INTERNET,
    INTERNET_V6,
    MAX_NODES,
    NATS,
    PUBLIC,
    RESERVED,
    SPECS,
    STUN_HOST,
    Host,
    Router,
    Spec,
    _allowed,
    _check,
    double_nat_pair,
    all_homes,
    easy_pair,
    line_homes,
    ipv6_pair,
    lan_pair,
    natpmp_double_pair,
    rst_pair,
    shifted_pair,
    symmetric_pair,
    upnp_pair,
)

REPO = Path(__file__).resolve().parents[2]
DELAYER = Path(__file__).with_name("delayer.py")
READY_TIMEOUT = 10.0  # a delayer must say "ready" within this
SETTLE_TIMEOUT = 10.0  # links must be operationally up within this


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
        self._lan6: dict[str, tuple[str, ipaddress.IPv6Address]] = {}  # IPv6 router -> (its /64, WAN address)
        self._addrs6: dict[str, list[str]] = {}
        self._files: list[str] = []  # configuration and pid files of the home daemons
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
        files, self._files = self._files, []
        for path in files:
            Path(path).unlink(missing_ok=True)
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
        """Packets the router's firewall dropped so far (its drop and reject rules' counters, over
        every table: IPv4 NAT, the miniupnpd home's inet table, the IPv6 firewall)."""
        out = self.run(router, ["nft", "-j", "list", "ruleset"], check=True).stdout
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

    def _add_ns(self, name: str, router: bool = False, ipv6: bool = False) -> str:
        ns = f"{self.tag}-{name}"
        _cmd(["ip", "netns", "add", ns])
        self.namespaces.append(ns)
        _cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
        if ipv6:  # no duplicate address detection: addresses are usable at once, the rig picks them
            ctl = ["net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.default.disable_ipv6=0",
                   "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
                   "net.ipv6.conf.all.accept_ra=0", "net.ipv6.conf.default.accept_ra=0"]
            if router:
                ctl.append("net.ipv6.conf.all.forwarding=1")
        else:
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
            ns = self._add_ns(r.name, router=True, ipv6=r.ipv6 is not None)
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
            if r.upnp and home_routers.miniupnpd_backend() == home_routers.IPTABLES:
                # miniupnpd-iptables edits the legacy tables: the whole router lives there
                for rule in home_routers.upnp_iptables_rules(r.nat, wif, seg.bridge, r.lan, r.unsolicited_tcp):
                    _cmd(["ip", "netns", "exec", ns, *rule])
            else:
                rules = (home_routers.upnp_ruleset(TABLE, r.nat, wif, seg.bridge, r.lan, r.unsolicited_tcp) if r.upnp
                         else home_routers.router_ruleset(TABLE, r.nat, wif, seg.bridge, r.unsolicited_tcp, r.udp,
                                                          r.natpmp))
                _cmd(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules)
            if r.udp_timeout is not None:  # conntrack's timeouts are the namespace's own
                for key in ("nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"):
                    _cmd(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"net.netfilter.{key}={r.udp_timeout}"])
            if r.ipv6 is not None:
                self._ipv6_router(r, ns, wif, seg.bridge)
            self._addrs[r.name] = [str(wan), str(gw)]
            self._up[r.name] = r.upstream
        for h in self.spec.hosts:
            if h.router is not None and h.router not in self._segs:
                raise ValueError(f"{h.name}: unknown router {h.router!r}")
            seg = self._segs[h.router or "internet"]
            if h.router is None and not h.addrs:
                raise ValueError(f"{h.name}: a public host needs explicit addrs")
            ips = [seg.take(a, 2) for a in h.addrs] or [seg.take(None, 2)]
            lan6 = self._lan6.get(h.router) if h.router else None
            ns = self._add_ns(h.name, ipv6=lan6 is not None)
            eth = f"{self.iftag}-eth0"
            self._attach(ns, eth, seg, h.link)
            for ip in ips:
                _cmd(["ip", "-n", ns, "addr", "add", f"{ip}/{seg.net.prefixlen}", "dev", eth])
            if seg.gateway is not None:
                _cmd(["ip", "-n", ns, "route", "add", "default", "via", str(seg.gateway)])
            self._addrs[h.name] = [str(ip) for ip in ips]
            self._up[h.name] = h.router
            if lan6 is not None:
                self._ipv6_host(h.name, ns, eth, lan6)
        self._route_ipv6_homes()
        self._settle()
        self._start_home_daemons()

    # ---- the richer homes (homes.py): IPv6 behind a firewall, miniupnpd

    def _ipv6_router(self, r: Router, ns: str, wan: str, lan: str) -> None:
        """Give an IPv6 home's router its WAN address on the internet's /64, its LAN's /64 and
        the stateful firewall; the internet namespace forwards IPv6 from then on."""
        wan6 = home_routers.ipv6_wan(INTERNET_V6, len(self._lan6))
        gw6 = home_routers.ipv6_lan(r.ipv6, 1)
        self._lan6[r.name] = (r.ipv6, wan6)
        _cmd(["ip", "netns", "exec", self.ns("internet"), "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=0"])
        _cmd(["ip", "-n", ns, "addr", "add", f"{wan6}/{INTERNET_V6.prefixlen}", "dev", wan, "nodad"])
        _cmd(["ip", "-n", ns, "addr", "add", f"{gw6}/64", "dev", lan, "nodad"])
        _cmd(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=home_routers.ipv6_firewall(TABLE + "6", wan, lan))
        self._addrs6[r.name] = [str(wan6), str(gw6)]

    def _ipv6_host(self, name: str, ns: str, eth: str, lan6: tuple[str, ipaddress.IPv6Address]) -> None:
        prefix, _ = lan6
        taken = sum(1 for other in self._addrs6 if other in self._up and self._up[other] == self._up[name])
        ip6 = home_routers.ipv6_lan(prefix, 2 + taken)
        _cmd(["ip", "-n", ns, "addr", "add", f"{ip6}/64", "dev", eth, "nodad"])
        _cmd(["ip", "-n", ns, "-6", "route", "add", "default", "via", str(home_routers.ipv6_lan(prefix, 1))])
        self._addrs6[name] = [str(ip6)]

    def _route_ipv6_homes(self) -> None:
        """Every IPv6 router reaches the other homes' /64s through their WAN addresses (the
        internet has no router of its own: its segment is one bridge)."""
        for router in self._lan6:
            for other, (prefix, wan6) in self._lan6.items():
                if other != router:
                    _cmd(["ip", "-n", self.ns(router), "-6", "route", "add", prefix, "via", str(wan6)])

    def _start_home_daemons(self) -> None:
        """The NAT-PMP servers of the routers that have one, the STUN responder, then miniupnpd on
        each miniupnpd router; returns once they serve."""
        for r in self.spec.routers:
            if r.natpmp:
                wan, gateway = self._addrs[r.name]
                responder = self.popen(r.name, home_routers.natpmp_command(gateway, wan, f"{self.iftag}-wan", TABLE),
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                home_routers.wait_ready(responder, "ready", read_line)
        upnp = [r for r in self.spec.routers if r.upnp]
        if not upnp:
            return
        stun_ips = self.addrs(STUN_HOST)
        stun = self.popen(STUN_HOST, home_routers.stun_command(stun_ips), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        home_routers.wait_ready(stun, "ready", read_line)
        for r in upnp:
            ns = self.ns(r.name)
            conf, pid = f"/tmp/{ns}-miniupnpd.conf", f"/tmp/{ns}-miniupnpd.pid"
            uuid = f"{os.getpid() & 0xFFFFFFFF:08x}-0000-4000-8000-{abs(hash(ns)) & 0xFFFFFFFFFFFF:012x}"
            Path(conf).write_text(home_routers.miniupnpd_conf(TABLE, f"{self.iftag}-wan", f"{self.iftag}-lan", r.lan,
                                                       stun_ips[0], uuid, home_routers.miniupnpd_backend()))
            self._files += [conf, pid]
            daemon = self.popen(r.name, home_routers.miniupnpd_command(conf, pid), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
            home_routers.wait_ready(daemon, home_routers.MINIUPNPD_READY, read_line)

    def addrs6(self, node: str) -> list[str]:
        """A node's IPv6 addresses (a router: WAN, then LAN gateway); empty without IPv6."""
        return list(self._addrs6.get(node, []))

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
    u.add_argument("scenario", choices=sorted(SPECS) + ["lines"],
                   help="lines: --homes N homes (home0, home1, ...) on the --line profile")
    u.add_argument("--line", choices=sorted(PROFILES), default="cable", help="lines: line profile")
    u.add_argument("--homes", type=int, default=2, help="lines: how many homes")
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
    if a.scenario == "lines":
        spec = line_homes(a.line, [f"home{i}" for i in range(max(1, min(a.homes, 8)))])
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
