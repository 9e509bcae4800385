"""The test harness's ``torchrun``: a job that torch's teardown aborted is run again, and the
directories it writes hold only the last run's files (an aborted run's traces beside them
would read as a second job)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import torchrun

pytestmark = pytest.mark.slow

# each rank writes a file named by its process, then, on its first run only, aborts as
# torch's gloo teardown does
SCRIPT = """
import os, sys
from pathlib import Path
out, state = Path(sys.argv[1]), Path(sys.argv[2])
rank = os.environ["RANK"]
out.mkdir(parents=True, exist_ok=True)
(out / f"rank{rank}-{os.getpid()}.json").write_text("{}")
ran = state / f"ran{rank}"
if not ran.exists():
    ran.write_text("")
    sys.stderr.write("terminate called without an active exception\\n")
    sys.stderr.flush()
    os._exit(1)
"""


def test_a_job_run_again_leaves_only_its_own_files(tmp_path: Path) -> None:
    # GIVEN a job whose first run aborts in teardown after each rank wrote its file
    script, out, state = tmp_path / "job.py", tmp_path / "out", tmp_path / "state"
    script.write_text(SCRIPT)
    state.mkdir()
    # WHEN the harness runs it, told the directory it writes
    done = torchrun(script, str(out), str(state), writes=[out])
    # THEN it ran again and succeeded, and the directory holds the second run's files alone
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name.split("-")[0] for p in out.iterdir()) == ["rank0", "rank1"]
