"""Consent first, as Folding@home v8 does: the first ``volunteer join`` on a machine shows what
it will use and either asks (a terminal) or starts paused with one line saying how to start.

Consent is recorded as ``consent = true`` in config.toml's ``[run]`` table, written there when
the donor says yes at the prompt, passes ``--yes``, or runs ``volunteer fold`` (from the CLI or
the web page); an unattended install (the systemd unit) passes ``--yes`` or writes the key
itself. The file is edited as text, so a donor's comments and layout survive.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from ..sizes import format_size

log = logging.getLogger(__name__)

CONSENT_LINE = "consent = true  # you agreed to donate this machine (`volunteer join` asked, or --yes)"
_RUN_TABLE = re.compile(r"^\s*\[run\]\s*(#.*)?$")
_CONSENT_KEY = re.compile(r"^\s*consent\s*=")


def summary_lines(node, *, policy_lines: list[str], web: str | None) -> list[str]:
    """What ``join`` will use, one item a line: device, memory cap, CPU threads, upload cap,
    port mapping, run-when policies."""
    device = node.device
    if device == "auto":
        device = "auto (a CUDA GPU if torch sees one, else the CPU)"
    memory = f"at most {node.max_gpu_memory:.0%} of the GPU's memory" if node.max_gpu_memory else "no cap (placement fills 90 %)"
    upload = f"{node.max_upload / 2**20:.1f} MiB/s" if node.max_upload else "no cap"
    experts = (f"{len(node.uids)} experts you named" if node.uids
               else "what the swarm's grid needs, up to " + (f"{node.max_experts}" if node.max_experts is not None else "what fits")
               if node.place else "none: this machine only routes the DHT")
    lines = [
        f"device:        {device}",
        f"GPU memory:    {memory}",
        *([f"RAM:           at most {format_size(node.max_ram)} for the experts on the CPU (--max-ram)"]
          if getattr(node, "max_ram", None) else []),
        (f"CPU threads:   {node.cpu_threads} of {os.cpu_count() or 1} cores" if node.cpu_threads
         else f"CPU threads:   torch's default ({os.cpu_count() or 1} cores on this machine; --cpu-threads N caps it)"),
        f"upload:        {upload}",
        port_mapping_line(node.stack),
        f"experts:       {experts}",
        "when:          " + "; ".join(policy_lines),
    ]
    if web:
        lines.append(f"web page:      {web} (this machine only, with a per-install token)")
    return lines


def port_mapping_line(stack) -> str:
    """What ``join`` does about port mapping with these stack options (None: the defaults,
    which map ports unless VOLUNTEER_NO_PORT_MAPPING=1)."""
    from ..net.stack import StackOptions

    if (stack if stack is not None else StackOptions()).port_mapping:
        return ("port mapping:  on (asks your router by PCP, NAT-PMP or UPnP to forward this node's ports "
                "while it runs, deleted when it stops; --no-port-mapping turns it off)")
    return "port mapping:  off (reachable through the swarm's relays and hole punching; no router changes)"


def ask(lines: list[str], *, read: Callable[[str], str] = input, out=sys.stdout) -> bool:
    """Show ``lines`` and ask on the terminal; True for yes (an empty answer is no)."""
    print("volunteer will donate this machine to the swarm with these settings:", file=out)
    for line in lines:
        print(f"  {line}", file=out)
    try:
        answer = read("Start donating now? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def record(path: Path) -> bool:
    """Write ``consent = true`` into ``path``'s ``[run]`` table (creating the file or the table);
    False (logged) when the file cannot be written."""
    try:
        text = path.read_text() if path.is_file() else ""
        lines = text.splitlines()
        existing = [i for i, line in enumerate(lines) if _CONSENT_KEY.match(line)]
        tables = [i for i, line in enumerate(lines) if _RUN_TABLE.match(line)]
        if existing:  # consent = false, say: only [run] has a key of that name
            lines[existing[0]] = CONSENT_LINE
        elif tables:
            lines.insert(tables[0] + 1, CONSENT_LINE)
        else:
            lines += ([""] if lines and lines[-1].strip() else []) + ["[run]", CONSENT_LINE]
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".tmp")
        partial.write_text("\n".join(lines) + "\n")
        os.replace(partial, path)
        return True
    except OSError as exc:
        log.warning("cannot record your consent in %s (%s): the next `volunteer join` asks again", path, exc)
        return False


__all__ = ["ask", "port_mapping_line", "record", "summary_lines"]
