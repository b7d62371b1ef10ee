"""What a NAT rig scenario is made of: links, routers, hosts, and the scenarios themselves.

Small frozen dataclasses, checked when a ``Rig`` is built from them (names, address ranges,
link values); ``rig.py`` turns a ``Spec`` into namespaces, ``homes.py`` knows how the routers of
the richer homes (miniupnpd, IPv6 firewalls) are set up. Only documentation and shared address
space is allowed (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 100.64.0.0/10, and 2001:db8::/32
for IPv6).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Sequence

from tests.nat.lines import DATACENTER, PROFILES, Link

ALLOWED = tuple(
    ipaddress.ip_network(n)
    for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "100.64.0.0/10")
)
INTERNET = ipaddress.ip_network("203.0.113.0/24")
DOCUMENTATION_V6 = ipaddress.ip_network("2001:db8::/32")
INTERNET_V6 = ipaddress.ip_network("2001:db8::/64")  # the internet's IPv6 segment (routers' WANs)
STUN_HOST = "stun"  # the STUN responder miniupnpd homes learn their public address from
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,19}$")
RESERVED = ("internet", "wire")
NATS = ("eim", "symmetric", "shifted")
MAX_NODES = 64


@dataclasses.dataclass(frozen=True)
class Router:
    """A NAT router: WAN leg on the internet (or on ``upstream``'s LAN), LAN bridge behind it.

    ``nat``: "eim" (masquerade: endpoint-independent mapping, keeps ports when it can),
    "symmetric" (masquerade random,fully-random: a fresh random port per new 5-tuple) or
    "shifted" (endpoint-independent, but never the port it was given: every mapping takes a port
    of 20000-29999, then kept for every destination, as carrier and some home NATs do).
    ``wan`` is picked from the upstream segment when None. ``link`` impairs the WAN leg.
    ``unsolicited_tcp``: "drop" (silently, as most home routers) or "reset" (answer a SYN
    nobody asked for with a RST, as some NAT boxes do; unsolicited UDP is still dropped).
    ``upnp``: the router runs miniupnpd with UPnP IGD, NAT-PMP and PCP (the spec needs a
    ``stun`` host on the internet: miniupnpd learns its public address from it).
    ``ipv6``: a /64 of 2001:db8::/32 routed to the LAN (no NAT) behind a stateful firewall; the
    router's WAN gets an address on the internet's 2001:db8::/64 (internet routers only).
    ``udp``: "pass", or "drop" (an office firewall: no UDP leaves the LAN, so no QUIC).
    ``udp_timeout``: seconds an idle UDP mapping lives (conntrack's, for this router alone; None:
    the kernel's 30 s / 120 s): a NAT that forgets mappings soon.
    ``natpmp``: the router answers NAT-PMP itself (``natpmp_responder``) and maps onto its own
    WAN address whatever its range: behind a carrier NAT, a 100.64 address nobody outside can
    reach, as many home routers do (miniupnpd refuses such an address).
    """

    name: str
    lan: str
    nat: str = "eim"
    wan: str | None = None
    upstream: str | None = None
    link: Link | None = None
    unsolicited_tcp: str = "drop"
    upnp: bool = False
    ipv6: str | None = None
    udp: str = "pass"
    udp_timeout: int | None = None
    natpmp: bool = False


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


def symmetric_pair(delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0, both: bool = False) -> Spec:
    """Like easy_pair, but nat_a is symmetric (endpoint-dependent mapping); nat_b too when ``both``."""
    return _pair("symmetric", delay_ms, jitter_ms, loss_pct, nat_b="symmetric" if both else "eim")


def _pair(nat_a: str, delay_ms: float, jitter_ms: float, loss_pct: float, nat_b: str = "eim") -> Spec:
    link = _link(delay_ms, jitter_ms, loss_pct)
    return Spec(
        routers=(
            Router("nat_a", "192.0.2.0/26", nat_a, "203.0.113.101", link=link),
            Router("nat_b", "192.0.2.64/26", nat_b, "203.0.113.102", link=link),
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


def line_homes(line: str, names: Sequence[str], nat: str | dict[str, str] = "eim",
               queue_ms: float = 100.0) -> Spec:
    """One home per name, each on a ``line`` (``lines.PROFILES``: caps, delay, loss): host
    ``name`` (198.51.100.x) behind router ``nat_<name>``; plus ``relay`` (203.0.113.10) in a
    datacenter 10 ms from the internet and ``public`` (203.0.113.20) on it. ``nat``: one NAT
    type for every home, or one per name (missing names get "eim")."""
    if not 1 <= len(names) <= 8:
        raise ValueError("line_homes: 1 to 8 homes")
    link = PROFILES[line].link(queue_ms)
    kinds = {n: (nat if isinstance(nat, str) else nat.get(n, "eim")) for n in names}
    return Spec(
        routers=tuple(Router(f"nat_{n}", f"198.51.100.{32 * i}/27", kinds[n], link=link)
                      for i, n in enumerate(names)),
        hosts=tuple(Host(n, f"nat_{n}") for n in names)
        + (Host("relay", addrs=("203.0.113.10",), link=DATACENTER), Host("public", addrs=("203.0.113.20",))),
    )


def shifted_pair(delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0, nat_b: str = "eim") -> Spec:
    """peer_a behind a NAT that is endpoint-independent but never keeps a port (``shifted``),
    peer_b behind ``nat_b``."""
    return _pair("shifted", delay_ms, jitter_ms, loss_pct, nat_b=nat_b)


def natpmp_double_pair(delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0) -> Spec:
    """peer_a behind home router nat_a, which maps ports by NAT-PMP onto its own WAN address
    100.64.0.2, behind the carrier NAT isp_a (a mapping nobody outside can reach); peer_b behind
    the EIM nat_b."""
    link = _link(delay_ms, jitter_ms, loss_pct)
    return Spec(
        routers=(
            Router("isp_a", "100.64.0.0/24", "eim", "203.0.113.111"),
            Router("nat_a", "192.0.2.0/26", "eim", "100.64.0.2", upstream="isp_a", link=link, natpmp=True),
            Router("nat_b", "192.0.2.64/26", "eim", "203.0.113.102", link=link),
        ),
        hosts=(Host("peer_a", "nat_a", ("192.0.2.2",)), Host("peer_b", "nat_b", ("192.0.2.66",)))
        + PUBLIC,
    )


SPECS = {"easy": easy_pair, "symmetric": symmetric_pair, "double": double_nat_pair, "rst": rst_pair,
         "shifted": shifted_pair, "natpmp_double": natpmp_double_pair}


def _allowed(addr: str) -> ipaddress.IPv4Address:
    ip = ipaddress.ip_address(addr)
    if not any(ip in n for n in ALLOWED):
        raise ValueError(f"{addr} is outside the rig's allowed ranges")
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
        if r.ipv6 is not None:
            lan6 = ipaddress.ip_network(r.ipv6)
            if lan6.version != 6 or lan6.prefixlen != 64 or not lan6.subnet_of(DOCUMENTATION_V6) or lan6 == INTERNET_V6:
                raise ValueError(f"{r.name}: ipv6 must be a /64 of 2001:db8::/32 other than {INTERNET_V6}")
            if r.upstream is not None:
                raise ValueError(f"{r.name}: an IPv6 home's router sits on the internet")
        if r.natpmp and r.upnp:
            raise ValueError(f"{r.name}: one port-mapping server per router (upnp or natpmp)")
        if r.upnp and STUN_HOST not in names:
            raise ValueError(f"{r.name}: a miniupnpd router needs a {STUN_HOST!r} host on the internet")
    for a in [r.wan for r in spec.routers if r.wan] + [a for h in spec.hosts for a in h.addrs]:
        _allowed(a)
    for x in list(spec.routers) + list(spec.hosts):
        problems = x.link.problems() if x.link else []
        if problems:
            raise ValueError(f"{x.name}: link values out of range: {'; '.join(problems)}")


STUN = Host(STUN_HOST, addrs=("203.0.113.40", "203.0.113.41"))


def upnp_pair(delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0) -> Spec:
    """peer_a behind a symmetric NAT whose router runs miniupnpd (UPnP IGD, NAT-PMP, PCP),
    peer_b behind a plain symmetric NAT: only the mapping can make this pair direct."""
    link = _link(delay_ms, jitter_ms, loss_pct)
    return Spec(
        routers=(
            Router("nat_a", "192.0.2.0/26", "symmetric", "203.0.113.101", link=link, upnp=True),
            Router("nat_b", "192.0.2.64/26", "symmetric", "203.0.113.102", link=link),
        ),
        hosts=(Host("peer_a", "nat_a", ("192.0.2.2",)), Host("peer_b", "nat_b", ("192.0.2.66",)), STUN) + PUBLIC,
    )


def ipv6_pair(delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0) -> Spec:
    """Two dual-stack homes: IPv4 behind symmetric NATs (so IPv4 cannot be punched), IPv6 routed
    behind stateful firewalls (only what a LAN host sent out may come back in)."""
    link = _link(delay_ms, jitter_ms, loss_pct)
    return Spec(
        routers=(
            Router("nat_a", "192.0.2.0/26", "symmetric", "203.0.113.101", link=link, ipv6="2001:db8:a::/64"),
            Router("nat_b", "192.0.2.64/26", "symmetric", "203.0.113.102", link=link, ipv6="2001:db8:b::/64"),
        ),
        hosts=(Host("peer_a", "nat_a", ("192.0.2.2",)), Host("peer_b", "nat_b", ("192.0.2.66",))) + PUBLIC,
    )


# Every kind of home the rig has, one volunteer in each (named after its home): the pair matrix
# of benchmarks/reach.py. lan1 and lan2 are two machines on one LAN (``ROUTER_OF``).
HOMES = ("easy", "symmetric", "double", "rst", "upnp", "v6a", "v6b", "office", "forgetful", "lan1", "lan2", "shifted",
         "pmp")
ROUTER_OF = {home: f"nat_{home}" for home in HOMES} | {"lan1": "nat_lan", "lan2": "nat_lan"}


def all_homes(delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0) -> Spec:
    """One volunteer per kind of home (``HOMES``): easy (EIM), symmetric, double (home EIM NAT
    behind a carrier's EIM NAT), rst (EIM, unsolicited SYNs answered with a RST), upnp
    (symmetric, with miniupnpd), v6a (IPv4 behind a symmetric NAT, IPv6 behind a stateful
    firewall: a mobile carrier, say), v6b (IPv4 behind EIM, IPv6 behind a stateful firewall),
    office (EIM, a firewall that drops all UDP), forgetful (EIM that forgets an idle UDP mapping
    after 25 s), lan1 and lan2 (two machines behind one EIM router that does not hairpin: its
    own public address is refused from inside), shifted (endpoint-independent, but never
    keeps a port) and pmp (a home router that maps by NAT-PMP onto its 100.64 WAN address,
    behind a carrier's EIM NAT); the relay, a public host and the STUN responder on the
    internet."""
    link = _link(delay_ms, jitter_ms, loss_pct)
    routers = (
        Router("nat_easy", "192.0.2.0/26", "eim", "203.0.113.101", link=link),
        Router("nat_symmetric", "192.0.2.64/26", "symmetric", "203.0.113.102", link=link),
        Router("isp_double", "100.64.0.0/24", "eim", "203.0.113.111"),
        Router("nat_double", "192.0.2.128/26", "eim", "100.64.0.2", upstream="isp_double", link=link),
        Router("nat_rst", "192.0.2.192/26", "eim", "203.0.113.104", link=link, unsolicited_tcp="reset"),
        Router("nat_upnp", "198.51.100.0/26", "symmetric", "203.0.113.105", link=link, upnp=True),
        Router("nat_v6a", "198.51.100.64/26", "symmetric", "203.0.113.106", link=link, ipv6="2001:db8:6a::/64"),
        Router("nat_v6b", "198.51.100.128/26", "eim", "203.0.113.107", link=link, ipv6="2001:db8:6b::/64"),
        Router("nat_office", "198.51.100.192/27", "eim", "203.0.113.108", link=link, udp="drop"),
        Router("nat_forgetful", "198.51.100.224/27", "eim", "203.0.113.109", link=link, udp_timeout=25),
        Router("nat_lan", "100.64.2.0/24", "eim", "203.0.113.110", link=link),
        Router("nat_shifted", "100.64.3.0/24", "shifted", "203.0.113.112", link=link),
        Router("isp_pmp", "100.64.4.0/24", "eim", "203.0.113.113"),
        Router("nat_pmp", "100.64.5.0/24", "eim", "100.64.4.2", upstream="isp_pmp", link=link, natpmp=True),
    )
    hosts = tuple(Host(home, ROUTER_OF[home]) for home in HOMES)
    return Spec(routers=routers, hosts=hosts + (Host("relay", addrs=("203.0.113.10",)), Host("public", addrs=("203.0.113.20",)), STUN))


def lan_pair(delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0) -> Spec:
    """peer_a and peer_b on one LAN behind an EIM router that does not hairpin (its own public
    address is refused from inside): only their LAN addresses join them directly."""
    link = _link(delay_ms, jitter_ms, loss_pct)
    return Spec(
        routers=(Router("nat_a", "100.64.2.0/24", "eim", "203.0.113.110", link=link),),
        hosts=(Host("peer_a", "nat_a", ("100.64.2.2",)), Host("peer_b", "nat_a", ("100.64.2.3",))) + PUBLIC,
    )


SPECS.update(upnp=upnp_pair, ipv6=ipv6_pair, homes=all_homes, lan=lan_pair)
