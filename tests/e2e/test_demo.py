"""The README's demo runs to the end and shows the relayed-then-direct path."""

import subprocess
import sys


def test_demo_runs():
    result = subprocess.run([sys.executable, "-m", "volunteer.cli.demo"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "reserved a slot" in out and "path: relayed via" in out
    assert "path=hole-punched" in out and out.rstrip().endswith("demo done")
