"""The benchmark scripts' `--smoke` modes run end to end and write their reports (no timing asserted).

Each runs as the documented command, in a subprocess, with tiny random models and its output
directed to a temporary folder, so CI exercises the real code paths without touching
benchmarks/results/.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["side_by_side", "lsp_latency", "memory"])
def test_smoke_mode_writes_report(name, tmp_path):
    pytest.importorskip("matplotlib")  # the `bench` extra
    pytest.importorskip("rapidfuzz")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{name}.py", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (tmp_path / f"{name}.md").read_text()
    assert f"Command: `python benchmarks/{name}.py --smoke --out {tmp_path}`" in report
    assert "torch " in report and "cores" in report and "Date: " in report
    assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert (tmp_path / f"{name}.json").exists()
    assert "| --- |" in report  # a markdown table of figures was written
