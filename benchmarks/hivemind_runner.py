"""Run a benchmark script in hivemind's own venv and read the JSON it prints (stdlib only)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("VOLUNTEER_HIVEMIND_VENV", ROOT / ".bench" / "hm"))


def run_hivemind(script: str, args: list[str], timeout: float) -> dict | None:
    """The script's JSON output, or None (with the reason printed) when hivemind is not set up."""
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"hivemind columns: n/a (no {python}; run bash benchmarks/setup_hivemind.sh)")
        return None
    import signal
    import tempfile

    # output to files, not pipes: hivemind's helper processes (p2pd) outlive the script holding
    # inherited pipes open; the whole process group is killed afterwards
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([str(python), str(ROOT / "benchmarks" / script), *args], stdout=out, stderr=err,
                                cwd=ROOT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"hivemind columns: n/a ({script} ran past {timeout:.0f} s)")
            return None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out.seek(0)
        err.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = err.read().strip().splitlines()[-1:]
            print(f"hivemind columns: n/a ({script} failed: {tail or proc.returncode})")
            return None
    return json.loads(lines[-1])
