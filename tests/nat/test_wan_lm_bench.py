"""benchmarks/wan_lm.py runs end to end on the rig: the language model trained through four
volunteers in their own homes on the fibre line (tiny size, a few steps) beside the local run,
the volunteers resuming from the local run's first experts; it prints each evaluation of both,
where the time went, and a last line a script can read. (Its figures are the benchmark's
business; this test holds only that the two runs start from the same model.)"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.nat import rig as rigmod

pytestmark = [pytest.mark.nat, pytest.mark.slow]
LAST_LINE = re.compile(r"wan_lm: fibre step 10 swarm (\d+\.\d{4}) bpb vs local (\d+\.\d{4}): [+-]\d+\.\d\d %")


def test_a_smoke_run_trains_through_the_rig_beside_the_local_run(nat_ok):
    result = subprocess.run(
        [sys.executable, str(rigmod.REPO / "benchmarks" / "wan_lm.py"), "--profiles", "fibre", "--size", "tiny",
         "--steps", "10", "--eval-every", "5"],
        capture_output=True, text=True, timeout=900, cwd=rigmod.REPO,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    match = LAST_LINE.fullmatch(lines[-1])
    assert match, lines[-1]
    # the first evaluation, five steps in: the same model, whatever the encoding's rounding did
    first = re.search(r"^fibre: step 5 swarm (\d+\.\d+) local (\d+\.\d+)", result.stdout, re.M)
    assert first and abs(float(first[1]) / float(first[2]) - 1) < 0.02, result.stdout[-3000:]
    assert any(line.startswith("fibre: volunteers' compute utilisation") for line in lines), result.stdout[-3000:]
