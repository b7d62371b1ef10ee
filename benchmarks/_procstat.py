"""CPU time of a running process, for the benchmarks that report CPU per MiB (Linux /proc)."""

from __future__ import annotations

import os
from pathlib import Path


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
