"""How the rig's home routers are set up: the plain NAT's rules, miniupnpd (UPnP IGD, NAT-PMP,
PCP) and IPv6 behind a stateful firewall. ``rig.py`` calls these while it builds; they only produce rulesets and
configuration text, and start the daemons a home needs.

miniupnpd home: one ``table inet rig`` whose base chains jump into the chains miniupnpd fills
(``miniupnpd`` for filter rules, ``prerouting_miniupnpd`` for its DNATs), then NAT the LAN out of
the WAN as the home's ``nat`` says. The router's own input chain jumps into miniupnpd's filter
chain too, so the ports its STUN test opens let the STUN answers in: miniupnpd refuses to map on a
WAN address in a documentation range (the rig's internet is one) unless it learns its public
address by STUN and sees that nothing filters it (``ext_perform_stun``). The LAN's masquerade
leaves the router's own packets alone, so its STUN test sees its ports unchanged.

miniupnpd comes in two builds, and the rig works with either (``miniupnpd_backend`` asks the
binary): ``miniupnpd-nftables`` fills the nft chains above; ``miniupnpd-iptables`` (Debian's
other package) fills chains of the legacy iptables tables through libiptc and cannot see nft
ones, so that home's router is set up in legacy iptables alone (``upnp_iptables_rules``: the
same NAT and filter, with ``MINIUPNPD`` chains in the filter and nat tables and
``MINIUPNPD-POSTROUTING``), and its configuration names those chains. ``RIG_MINIUPNPD`` names
another binary to run (an unpacked build, say).

IPv6 home: the LAN's /64 is routed, not translated; ``table ip6 rig6`` lets out everything the LAN
sends and in only what answers it (conntrack), plus the neighbour discovery a link needs. A TCP
simultaneous open or a UDP punch goes through two such firewalls as through two EIM NATs.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import shutil
import subprocess
import sys
from pathlib import Path

MINIUPNPD_READY = "Listening for NAT-PMP/PCP traffic"
READY_TIMEOUT = 15.0  # miniupnpd's STUN test (four requests, answers within 3 s) and the responder
STUN_PORTS = (3478, 3479)
HERE = Path(__file__).resolve().parent
MINIUPNPD = os.environ.get("RIG_MINIUPNPD", "miniupnpd")
NFTABLES, IPTABLES = "nftables", "iptables"


@functools.lru_cache(maxsize=None)
def miniupnpd_backend(binary: str = MINIUPNPD) -> str:
    """Which firewall the miniupnpd build drives: ``nftables`` or ``iptables`` (its --version
    says "using netfilter(iptables) backend"); nftables when it cannot tell."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return NFTABLES
    return IPTABLES if "(iptables)" in out.stdout + out.stderr else NFTABLES


def legacy_iptables() -> str:
    """The iptables that edits the legacy tables libiptc (miniupnpd-iptables) uses."""
    return shutil.which("iptables-legacy") or "iptables"


def router_ruleset(table: str, nat: str, wan: str, lan: str, unsolicited_tcp: str = "drop", udp: str = "pass",
                   natpmp: bool = False) -> str:
    """nftables rules of a plain home/carrier router (no port mapping): NAT out of WAN, drop unsolicited from WAN.

    Machines on one LAN reach each other (bridged frames may pass the forward hook where
    br_netfilter is loaded); the LAN reaching the router's own WAN address (hairpinning) is
    refused, as by many home routers.
    Drops are silent (no reject, so no RST/ICMP) and counted; the input chain also drops new
    traffic to the router's own WAN address, so the router never answers for itself. With
    ``unsolicited_tcp="reset"`` a new TCP connection to the WAN address (a SYN that matches no
    mapping) is answered with a RST instead, counted too. ``natpmp``: the router's NAT-PMP
    server (``natpmp_responder``) fills chain ``natpmp`` with DNATs, which the forward chain lets
    through.
    """
    flags = " random,fully-random" if nat == "symmetric" else ""
    # shifted: a source port outside the range gets one inside it, and the kernel reuses a
    # source's mapping for every destination (nf_nat's find_appropriate_src): EIM, new ports
    shift = f'oifname "{wan}" meta l4proto {{ tcp, udp }} masquerade to :20000-29999\n    ' if nat == "shifted" else ""
    reset = f'iifname "{wan}" meta l4proto tcp counter reject with tcp reset\n    ' if unsolicited_tcp == "reset" else ""
    # an office firewall: nothing over UDP leaves (QUIC never connects; DNS would be the LAN's own)
    no_udp = f'iifname "{lan}" meta l4proto udp counter drop\n    ' if udp == "drop" else ""
    mapped = ""
    forwarded = ""
    if natpmp:
        mapped = """
  chain natpmp {
  }
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    jump natpmp
  }"""
        forwarded = "ct status dnat accept\n    "
    return f"""
table ip {table} {{{mapped}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    {shift}oifname "{wan}" masquerade{flags}
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    ct state invalid counter drop
    ct state established,related accept
    {forwarded}    iifname "{lan}" oifname "{lan}" accept
    {no_udp}iifname "{lan}" oifname "{wan}" accept
    counter drop
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname "{wan}" ct state established,related accept
    {reset}iifname "{wan}" counter drop
  }}
}}
"""


def upnp_ruleset(table: str, nat: str, wan: str, lan: str, lan_net: str, unsolicited_tcp: str = "drop") -> str:
    """The nftables ruleset of a miniupnpd router (see the module docstring)."""
    flags = " random,fully-random" if nat == "symmetric" else ""
    # shifted: a source port outside the range gets one inside it, and the kernel reuses a
    # source's mapping for every destination (nf_nat's find_appropriate_src): EIM, new ports
    shift = f'oifname "{wan}" meta l4proto {{ tcp, udp }} masquerade to :20000-29999\n    ' if nat == "shifted" else ""
    reset = f'iifname "{wan}" meta l4proto tcp counter reject with tcp reset\n    ' if unsolicited_tcp == "reset" else ""
    return f"""
table inet {table} {{
  chain miniupnpd {{
  }}
  chain prerouting_miniupnpd {{
  }}
  chain postrouting_miniupnpd {{
  }}
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    jump prerouting_miniupnpd
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    jump postrouting_miniupnpd
    ip saddr {lan_net} oifname "{wan}" masquerade{flags}
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    ct state invalid counter drop
    ct state established,related accept
    iifname "{wan}" jump miniupnpd
    iifname "{lan}" oifname "{lan}" accept
    iifname "{lan}" oifname "{wan}" accept
    counter drop
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname "{wan}" ct state established,related accept
    iifname "{wan}" jump miniupnpd
    {reset}iifname "{wan}" counter drop
  }}
}}
"""


def upnp_iptables_rules(nat: str, wan: str, lan: str, lan_net: str, unsolicited_tcp: str = "drop") -> list[list[str]]:
    """``upnp_ruleset``'s router in legacy iptables, for miniupnpd-iptables: one argv per rule."""
    ipt = legacy_iptables()
    flags = ["--random", "--random-fully"] if nat == "symmetric" else []
    reset = [[ipt, "-A", "INPUT", "-i", wan, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"]] \
        if unsolicited_tcp == "reset" else []
    return [
        [ipt, "-t", "nat", "-N", "MINIUPNPD"],
        [ipt, "-t", "nat", "-N", "MINIUPNPD-POSTROUTING"],
        [ipt, "-t", "mangle", "-N", "MINIUPNPD"],
        [ipt, "-t", "filter", "-N", "MINIUPNPD"],
        [ipt, "-t", "nat", "-A", "PREROUTING", "-i", wan, "-j", "MINIUPNPD"],
        [ipt, "-t", "nat", "-A", "POSTROUTING", "-o", wan, "-j", "MINIUPNPD-POSTROUTING"],
        [ipt, "-t", "nat", "-A", "POSTROUTING", "-s", lan_net, "-o", wan, "-j", "MASQUERADE", *flags],
        [ipt, "-t", "mangle", "-A", "PREROUTING", "-i", wan, "-j", "MINIUPNPD"],
        [ipt, "-A", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"],
        [ipt, "-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
        [ipt, "-A", "FORWARD", "-i", wan, "!", "-o", wan, "-j", "MINIUPNPD"],
        [ipt, "-A", "FORWARD", "-i", lan, "-o", lan, "-j", "ACCEPT"],
        [ipt, "-A", "FORWARD", "-i", lan, "-o", wan, "-j", "ACCEPT"],
        [ipt, "-A", "FORWARD", "-j", "DROP"],
        [ipt, "-A", "INPUT", "-i", wan, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
        [ipt, "-A", "INPUT", "-i", wan, "-j", "MINIUPNPD"],
        *reset,
        [ipt, "-A", "INPUT", "-i", wan, "-j", "DROP"],
    ]


def miniupnpd_conf(table: str, wan: str, lan: str, lan_net: str, stun_ip: str, uuid: str, backend: str = NFTABLES) -> str:
    """miniupnpd's configuration: UPnP IGD on the LAN bridge, NAT-PMP and PCP (one switch), the
    public address by STUN, mappings only for LAN hosts and their own address (secure mode);
    the chains it fills are ``backend``'s (see the module docstring)."""
    if backend == IPTABLES:
        chains = "upnp_forward_chain=MINIUPNPD\nupnp_nat_chain=MINIUPNPD\nupnp_nat_postrouting_chain=MINIUPNPD-POSTROUTING\n"
    else:
        chains = (f"upnp_table_name={table}\nupnp_nat_table_name={table}\nupnp_forward_chain=miniupnpd\n"
                  "upnp_nat_chain=prerouting_miniupnpd\nupnp_nat_postrouting_chain=postrouting_miniupnpd\n")
    return f"""ext_ifname={wan}
listening_ip={lan}
http_port=0
enable_upnp=yes
enable_natpmp=yes
secure_mode=yes
ext_perform_stun=yes
ext_stun_host={stun_ip}
ext_stun_port={STUN_PORTS[0]}
{chains}min_lifetime=60
max_lifetime=86400
uuid={uuid}
allow 1024-65535 {lan_net} 1024-65535
deny 0-65535 0.0.0.0/0 0-65535
"""


def ipv6_firewall(table: str, wan: str, lan: str) -> str:
    """A stateful IPv6 firewall: out anything, in only replies and neighbour discovery."""
    return f"""
table ip6 {table} {{
  chain forward {{
    type filter hook forward priority filter; policy accept;
    ct state invalid counter drop
    ct state established,related accept
    iifname "{lan}" oifname "{wan}" accept
    counter drop
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    ct state established,related accept
    icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert }} accept
    iifname "{lan}" accept
    iifname "{wan}" counter drop
  }}
}}
"""


def ipv6_wan(internet6: ipaddress.IPv6Network, index: int) -> ipaddress.IPv6Address:
    """The WAN address of the ``index``-th IPv6 router on the internet's /64 (from ::101 on)."""
    return internet6[0x101 + index]


def ipv6_lan(prefix: str, index: int) -> ipaddress.IPv6Address:
    """Address ``index`` of a home's /64: 1 is the router, LAN hosts from 2 on."""
    return ipaddress.IPv6Network(prefix)[index]


def natpmp_command(lan_ip: str, wan_ip: str, wan_if: str, table: str) -> list[str]:
    """The rig's NAT-PMP server on a router (``natpmp_responder``): maps onto ``wan_ip``."""
    return [sys.executable, str(HERE / "natpmp_responder.py"), lan_ip, wan_ip, wan_if, "--table", table]


def stun_command(ips: list[str]) -> list[str]:
    """The STUN responder's command line (two addresses, two ports)."""
    return [sys.executable, str(HERE / "stun_responder.py"), ips[0], ips[1],
            "--port", str(STUN_PORTS[0]), "--alt-port", str(STUN_PORTS[1])]


def miniupnpd_command(conf_path: str, pid_path: str) -> list[str]:
    """miniupnpd in the foreground (-d: logs to stderr), with this rig's pid file."""
    return [MINIUPNPD, "-d", "-f", conf_path, "-P", pid_path]


def wait_ready(proc: subprocess.Popen, marker: str, read_line, timeout: float = READY_TIMEOUT) -> list[str]:
    """Lines a daemon printed until one containing ``marker``; RuntimeError (with them) otherwise."""
    import time

    lines: list[str] = []
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        try:
            line = read_line(proc, max(0.05, left))
        except TimeoutError:
            line = None
        if line:
            lines.append(line.rstrip())
            if marker in line:
                return lines
        if not line and (proc.poll() is not None or time.monotonic() >= end):
            raise RuntimeError(f"daemon not ready ({marker!r} never came): " + " | ".join(lines[-8:]))


__all__ = [
    "IPTABLES",
    "MINIUPNPD",
    "MINIUPNPD_READY",
    "NFTABLES",
    "miniupnpd_backend",
    "upnp_iptables_rules",
    "ipv6_firewall",
    "ipv6_lan",
    "ipv6_wan",
    "miniupnpd_command",
    "miniupnpd_conf",
    "natpmp_command",
    "stun_command",
    "router_ruleset",
    "upnp_ruleset",
    "wait_ready",
]
