"""What ``volunteer doctor`` says about reach, from what it found: pure, no network.

Each function turns the facts one check gathered (the port mapper's snapshot, the NAT mapping
types peers observed, a hairpin dial, this machine's IPv6 addresses) into a ``Check`` line: OK,
WARN or FAIL, what was found, and what to do about it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..kinds import Check
from ..net.nat.observed import MappingType

if TYPE_CHECKING:
    from ..net.nat.portmap.service import PortMapStatus

PROTOCOL_NAMES = {"pcp": "PCP", "natpmp": "NAT-PMP", "upnp": "UPnP IGD"}
MAPPING_FIX = ("turn on UPnP IGD, NAT-PMP or PCP in your router's settings, or forward the listen ports "
               "by hand (then use --listen with those ports); without it you still connect, through relays "
               "and hole punching")


NO_GATEWAY = "no IPv4 default gateway to ask"  # the port mapper's words when there is no router to ask
# a router's own answer: a PCP or NAT-PMP result code ("PCP: not authorized"), or PCP's version
# error from a NAT-PMP router; silence, a closed port or no UPnP device are not answers
_ANSWER = re.compile(r"^(?:PCP|NAT-PMP): |\bspeaks NAT-PMP, not PCP\b")


def _without_name(protocol: str, error: str) -> str:
    """``error`` without the protocol's name in front when it already says it ("PCP: PCP: …")."""
    name = PROTOCOL_NAMES.get(protocol, protocol).split()[0]
    return error[len(name) + 2:] if error.startswith(f"{name}: ") else error


def port_mapping_check(snapshot: PortMapStatus | None, off_reason: str = "") -> Check:
    """The router port mapping: which protocol the router speaks, the mapping it gave and whether
    a peer reached it from outside, or why there is none. ``snapshot`` is ``PortMapper.snapshot()``
    (None: mapping was off, for ``off_reason``)."""
    if snapshot is None:
        undo = f"unset {off_reason}" if "=" in off_reason else f"drop {off_reason or '--no-port-mapping'}"
        return Check("WARN", "port mapping", f"off ({off_reason or 'not asked for'})",
                     f"{undo} to let the router forward your ports")
    protocol = snapshot.get("protocol")
    if protocol is None:
        raw = {p: str(e) for p, e in (snapshot.get("errors") or {}).items()}
        why = "; ".join(f"{PROTOCOL_NAMES.get(p, p)}: {_without_name(p, e)}" for p, e in raw.items()) \
            or snapshot.get("error") or "no answer"
        answered = [p for p, e in raw.items() if _ANSWER.search(e)]
        gateway_asks = [e for p, e in raw.items() if p != "upnp"]  # PCP and NAT-PMP ask the default gateway
        if gateway_asks and all(e == NO_GATEWAY for e in gateway_asks) and not _ANSWER.search(raw.get("upnp", "")):
            return Check("WARN", "port mapping", f"no router to ask ({why})",
                         "this machine has no IPv4 default route; port mapping needs a router on the way out")
        if answered:  # it speaks the protocol and said no: "speaks none" would contradict its answer
            names = ", ".join(PROTOCOL_NAMES.get(p, p) for p in answered)
            return Check("WARN", "port mapping", f"the router answered {names} but refused a mapping ({why})",
                         "allow port mapping for this machine in your router's settings (UPnP IGD, NAT-PMP or PCP), "
                         "or forward the listen ports by hand; without it you still connect, through relays and "
                         "hole punching")
        return Check("WARN", "port mapping", f"the router speaks none of PCP, NAT-PMP, UPnP IGD ({why})", MAPPING_FIX)
    name = PROTOCOL_NAMES.get(protocol, protocol)
    mappings = snapshot.get("mappings") or []
    if not mappings:
        return Check("WARN", "port mapping", f"{name} answered but gave no mapping: {snapshot.get('error') or 'no reason given'}",
                     "the router refused: free some of its forwarded ports, or forward the listen ports by hand")
    confirmed = [m["addr"] for m in mappings if m.get("confirmed")]
    refused = [m["addr"] for m in mappings if m.get("refused")]
    if confirmed:
        rest = f"; {len(mappings) - len(confirmed)} not reached yet" if len(confirmed) < len(mappings) else ""
        return Check("OK", "port mapping", f"{name}: {', '.join(confirmed)} reached from outside{rest}")
    if refused:
        return Check("WARN", "port mapping",
                     f"{name} mapped {', '.join(refused)}, but no peer could dial it from outside: not advertised",
                     "your router's public address is behind another NAT (your provider's, CGNAT): ask your "
                     "provider for a public IPv4 address, or use IPv6")
    addrs = ", ".join(m["addr"] for m in mappings)
    return Check("WARN", "port mapping", f"{name} mapped {addrs}, not yet confirmed from outside: not advertised",
                 "give doctor a relay or bootstrap peer that serves AutoNAT, to dial the mapping back")


def nat_mapping_check(transport: str, mapping: MappingType, observed: Sequence[str], mapped: bool = False) -> Check:
    """Whether our NAT's mapping varies by destination, for ``transport`` ("TCP" or "QUIC"):
    a mapping that does not can be hole-punched; one that does (a symmetric NAT) cannot, except
    over QUIC against an easy NAT by birthday probing, or through a port mapping (``mapped``)."""
    name = f"NAT mapping {transport}"
    seen = ", ".join(observed[:2]) or "no observation"
    if mapping is MappingType.ENDPOINT_INDEPENDENT:
        return Check("OK", name, f"same for every destination, endpoint-independent ({seen}): hole punching can work")
    if mapping is MappingType.ENDPOINT_DEPENDENT:
        if mapped:
            return Check("OK", name, f"varies by destination, symmetric ({seen}); the port mapping lets peers in")
        reach = ("hole punching reaches only peers behind easy NATs, by birthday probing" if transport == "QUIC"
                 else "hole punching fails; QUIC's birthday probing reaches peers behind easy NATs")
        return Check("WARN", name, f"varies by destination, symmetric ({seen}): {reach}",
                     "turn on UPnP IGD, NAT-PMP or PCP, or set the router's NAT to endpoint-independent "
                     "(\"full cone\"); IPv6 avoids the NAT altogether")
    return Check("WARN", name, f"unknown: needs observations from two peers ({seen})",
                 "give doctor two relays or bootstrap peers (each listing a "
                 + ("/udp/…/quic-v1 address)" if transport == "QUIC" else "TCP address)"))


def hairpin_check(result: bool | None, target: str | None, why: str = "") -> Check:
    """Hairpinning: whether a connection from inside the home to its own public address (``target``)
    comes back in, which is how two volunteers on one LAN would reach each other by their public
    addresses. None: nothing to try (no public address known)."""
    if result is None:
        return Check("WARN", "hairpinning", "not tried: no public address of ours known",
                     "give doctor a relay or bootstrap peer, so it learns your public address")
    if result:
        return Check("OK", "hairpinning", f"a dial to our own {target} from inside comes back in")
    return Check("WARN", "hairpinning", f"a dial to our own {target} from inside does not come back ({why or 'no answer'})",
                 "volunteers on this LAN find each other by mDNS (keep it on) or meet through relays; "
                 "a router setting (NAT loopback, hairpin NAT) fixes it")


def ipv6_check(global_addrs: Sequence[str], reached: bool | None, why: str = "") -> Check:
    """IPv6: whether this machine has a global address and reached a peer over it (``reached``:
    None when no peer offered an IPv6 address to try)."""
    if not global_addrs:
        return Check("WARN", "IPv6", "no global IPv6 address: every connection goes through IPv4 NATs",
                     "turn on IPv6 on your router if your provider offers it: volunteers with IPv6 reach each other "
                     "without NAT (through a firewall that hole punching opens)")
    shown = ", ".join(global_addrs[:2])
    if reached is None:
        return Check("OK", "IPv6", f"global address {shown} (no peer offered IPv6 to try)")
    if reached:
        return Check("OK", "IPv6", f"global address {shown}; a peer reached over IPv6")
    return Check("WARN", "IPv6", f"global address {shown}, but no peer answered over IPv6 ({why or 'no answer'})",
                 "their firewall or ours dropped it (hole punching opens stateful firewalls for volunteers); "
                 "if no volunteer ever connects over IPv6, check that your router passes outgoing IPv6")


__all__ = ["hairpin_check", "ipv6_check", "nat_mapping_check", "port_mapping_check"]
