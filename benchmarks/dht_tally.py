"""Which part of a daemon sends its DHT requests: a measuring aid for ``scale_processes.py --tally``.

``install()`` wraps ``DHTNode.request`` (every request a node sends goes through it) and the
node's entry points (lookups, stores, pings, its upkeep), so that each request is counted under
its operation (``op``: PING, FIND_NODE, FIND_VALUE, STORE, ...) and under the code that started
the lookup or store it belongs to: the first frame outside the DHT's own modules when the entry
point was called (``volunteer/dht/declare.py:_heartbeat``, ``volunteer/replicas/schedule.py:sync_grid``,
...). A lookup's requests run in the node's nursery, not the caller's task, so the caller rides
along in a context variable that the spawned tasks are handed explicitly.

A daemon started with ``VOLUNTEER_DHT_TALLY=DIR`` and this module importable installs it from a
``sitecustomize`` (``scale_processes.py`` writes one) and writes its counts to ``DIR/PID.json``
every ``DUMP_PERIOD`` seconds: ``{"t": wall time, "counts": {"caller|op": requests}}``. Nothing
of the daemon's behaviour changes; only its requests are counted.
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

DUMP_PERIOD = 2.0
ENTRY_POINTS = ("find_closest", "get_many", "held_elsewhere", "get", "store", "store_many", "ping", "bootstrap",
                "add_peer", "_quiet_lookup", "_republish", "_check_alive", "_forward", "_recheck_after_disconnect",
                "_add_if_unknown")
DHT_FILES = ("/volunteer/dht/node.py", "/volunteer/dht/lookups.py", "/volunteer/dht/storing.py",
             "/volunteer/dht/query.py", "dht_tally.py", "/trio/", "/contextlib.py", "/functools.py")

caller: contextvars.ContextVar[str | None] = contextvars.ContextVar("dht_tally_caller", default=None)
counts: Counter[str] = Counter()


def _where(entry: str) -> str:
    """The first frame outside the DHT's own code and trio: who called ``entry``."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(part in name for part in DHT_FILES) and "<frozen" not in name:
            short = name.split("/volunteer/", 1)[-1] if "/volunteer/" in name else os.path.basename(name)
            return f"{short}:{frame.f_code.co_name}"
        frame = frame.f_back
    return f"dht:{entry}"  # the node's own upkeep, started in its own tasks


def _entry(name: str, fn):
    @functools.wraps(fn)
    async def wrapped(*args, **kwargs):
        if caller.get() is not None:  # an inner call of an outer entry point: the outer one counts
            return await fn(*args, **kwargs)
        token = caller.set(_where(name))
        try:
            return await fn(*args, **kwargs)
        finally:
            caller.reset(token)

    return wrapped


def install() -> None:
    """Count every DHT request by (caller, op); dump to ``$VOLUNTEER_DHT_TALLY`` if set."""
    from volunteer.dht import lookups
    from volunteer.dht.node import DHTNode

    original_request = DHTNode.request

    async def request(self, contact, message):
        counts[f"{caller.get() or 'dht:unattributed'}|{getattr(message, 'op', type(message).__name__)}"] += 1
        return await original_request(self, contact, message)

    DHTNode.request = request  # type: ignore[method-assign]
    for name in ENTRY_POINTS:
        fn = getattr(DHTNode, name, None)
        if fn is not None:
            setattr(DHTNode, name, _entry(name, fn))

    original_spawner = lookups.LookupMixin._spawner

    def spawner(self, fallback):
        spawn = original_spawner(self, fallback)
        who = caller.get()

        def start_soon(fn, *args):
            async def carried(*inner):
                caller.set(who)
                return await fn(*inner)

            return spawn(carried, *args)

        return start_soon

    lookups.LookupMixin._spawner = spawner  # type: ignore[method-assign]
    folder = os.environ.get("VOLUNTEER_DHT_TALLY")
    if folder:
        threading.Thread(target=_dump_forever, args=(Path(folder) / f"{os.getpid()}.json",), daemon=True).start()


def _dump_forever(path: Path) -> None:
    while True:
        time.sleep(DUMP_PERIOD)
        snapshot = {"t": time.time(), "counts": dict(counts)}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(snapshot))
        tmp.replace(path)


def read(folder: Path) -> dict[int, dict]:
    """pid -> the last dump of each daemon in ``folder``."""
    out = {}
    for path in folder.glob("*.json"):
        try:
            out[int(path.stem)] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return out


def rates(before: dict[int, dict], after: dict[int, dict], pids: set[int] | None = None) -> dict[str, float]:
    """caller|op -> requests per daemon per minute between two ``read``s, over the daemons
    present in both (``pids``: only these)."""
    total: Counter[str] = Counter()
    daemons = 0
    for pid, end in after.items():
        start = before.get(pid)
        if start is None or (pids is not None and pid not in pids) or end["t"] <= start["t"]:
            continue
        daemons += 1
        minutes = (end["t"] - start["t"]) / 60.0
        for key, value in end["counts"].items():
            total[key] += (value - start["counts"].get(key, 0)) / minutes
    return {key: value / daemons for key, value in total.most_common()} if daemons else {}


# what ``benchmarks/scale.py``'s simulated volunteers also do: heartbeats (the declarer) and the
# node's own upkeep (bootstrap, bucket refreshes, pings, republishing); every other caller is a
# reader the simulation does not have (self-care's look-ups, the proof board, replica sync, ...)
SIMULATED = ("dht/declare.py:", "dht:", "net/host.py:_run_service", "cli/joincmd.py:run_join")


def unsimulated(tally: dict[str, float]) -> float:
    """Requests per daemon per minute from callers the simulation does not model."""
    return sum(rate for key, rate in tally.items() if not key.startswith(SIMULATED))


SITECUSTOMIZE = """\
import os
if os.environ.get("VOLUNTEER_DHT_TALLY"):
    import sys
    sys.path.insert(0, {root!r})
    from benchmarks import dht_tally
    dht_tally.install()
"""


def write_sitecustomize(folder: Path) -> Path:
    """A ``sitecustomize.py`` in ``folder`` that installs the tally in every Python started with
    ``folder`` on its PYTHONPATH and ``VOLUNTEER_DHT_TALLY`` set; returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parent.parent)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(root=root))
    return folder
