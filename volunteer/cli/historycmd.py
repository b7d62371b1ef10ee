"""``volunteer history``: what this machine gave, by day and by month, from the history files
the daemon keeps (saved every minute while it runs; a stopped daemon's history is all there)."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from ..errors import VolunteerError
from ..sizes import format_size
from ..widgets import duration
from ..donor.history import Bucket, load_all

HISTORY_EXAMPLES = """\
examples:
  volunteer history                 the last 30 days and every month, all swarms on this machine
  volunteer history --days 90       more days
  volunteer history --swarm demo    one swarm only
  volunteer history --json          every kept hour, day and month, for scripts
"""


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``volunteer history``."""
    p = sub.add_parser("history", help="what this machine contributed, by day and by month (--json for scripts)",
                       description="Print the contribution history this machine keeps: calls answered, samples, "
                       "compute time on GPU and CPU, bytes sent, uptime and trainers served, by day and by month.",
                       epilog=HISTORY_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--days", type=int, default=30, metavar="N", help="how many days to list (default 30)")
    p.add_argument("--swarm", metavar="ID", help="only this swarm's history (default: all swarms summed)")
    p.add_argument("--json", action="store_true", help="print every kept hour, day and month as JSON")
    p.set_defaults(run=run_history)


COLUMNS = ("calls", "samples", "GPU time", "CPU time", "sent", "uptime", "trainers")


def _row(label: str, b: Bucket) -> list[str]:
    return [label, str(b.calls), str(b.samples), duration(b.gpu_s), duration(b.cpu_s), format_size(b.bytes_sent),
            duration(b.uptime_s), str(b.trainers.count())]


def _print_table(title: str, rows: list[list[str]]) -> None:
    header = [title, *COLUMNS]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
    for row in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))


def run_history(args: argparse.Namespace) -> int:
    """Print the kept history by day and by month (or all of it as JSON)."""
    from ..swarmfile import state_dir

    if args.days < 1:
        raise VolunteerError("--days must be 1 or more")
    if args.swarm is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", args.swarm):
        raise VolunteerError(f"--swarm {args.swarm[:40]!r}: expected a swarm id (letters, digits, . _ -)")
    history = load_all(state_dir(), args.swarm)
    if args.json:
        print(json.dumps({
            "hours": [{"start": k, **b.as_dict()} for k, b in sorted(history.hours.items())],
            "days": [{"day": k, **b.as_dict()} for k, b in sorted(history.days.items())],
            "months": [{"month": k, **b.as_dict()} for k, b in sorted(history.months.items())],
        }, indent=2))
        return 0
    if not history.days:
        print("no contributions recorded on this machine yet: `volunteer join SWARM` starts donating")
        return 0
    now = time.time()
    days = [(day, b) for day, b in history.daily(now, args.days) if day in history.days]
    _print_table("day", [_row(day, b) for day, b in days] or [_row("(none in range)", Bucket())])
    print()
    _print_table("month", [_row(month, b) for month, b in sorted(history.months.items())])
    total = Bucket()
    for b in history.months.values():
        total = total.merge(b)
    print()
    print(f"in all: {total.calls} calls, {total.samples} samples, {duration(total.gpu_s)} on GPUs, "
          f"{duration(total.cpu_s)} on CPUs, {format_size(total.bytes_sent)} sent, {duration(total.uptime_s)} up")
    sys.stdout.flush()
    return 0
