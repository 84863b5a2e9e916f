"""The benchmark scripts' `--smoke` modes run end to end and write their reports (no timing asserted).

Each runs as the documented command, in a subprocess, with tiny random models and its output
directed to a temporary folder, so CI exercises the real code paths without touching
benchmarks/results/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Benchmark data lives beside the repository (CI has it); a contributor's plain clone does not.
HUMANEVAL = ROOT.parent / "shared/benchmarks/humaneval-infilling"
needs_humaneval = pytest.mark.skipif(
    not HUMANEVAL.exists(), reason="../shared/benchmarks/humaneval-infilling is not beside the repo"
)


def run_script(name: str, args: list[str], timeout: float) -> None:
    """A benchmark script as its documented command, offline and on one thread; it must exit 0."""
    pytest.importorskip("matplotlib")  # the `bench` extra
    pytest.importorskip("rapidfuzz")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{name}.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "name", [pytest.param("side_by_side", marks=needs_humaneval), "lsp_latency", "memory"]
)
def test_smoke_mode_writes_report(name, tmp_path):
    run_script(name, ["--smoke", "--out", str(tmp_path)], timeout=880)
    report = (tmp_path / f"{name}.md").read_text()
    assert f"Command: `python benchmarks/{name}.py --smoke --out {tmp_path}`" in report
    assert "torch " in report and "cores" in report and "Date: " in report
    assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert (tmp_path / f"{name}.json").exists()
    assert "| --- |" in report  # a markdown table of figures was written
    if name == "lsp_latency":
        # every answered request is matched to the server's log line for its document version; the
        # typed line's requests are answered by model runs (the cache needs a suggestion typed into)
        raw = json.loads((tmp_path / f"{name}.json").read_text())
        (summary,) = raw["summaries"].values()
        assert (
            1 <= summary["answered_model"]
            and summary["answered_model"] + summary["answered_cache"] <= (summary["answered"])
        )
        (engine,) = raw["engine"].values()
        assert (
            engine["model_runs"] + engine["cache_hits"] == engine["completions"] >= summary["answered_model"]
        )


@pytest.mark.timeout(600)
@needs_humaneval
def test_model_quality_scores_what_the_editor_shows(tmp_path):
    """The shipped models through `dg_lsp.pipeline` on a few HumanEval tasks, programs run sandboxed."""
    args = ["--spans", "0", "--single-every", "60", "--multi-every", "0", "--light-every", "0",
            "--through", "editor", "--workers", "1", "--out", str(tmp_path)]  # fmt: skip
    run_script("model_quality", args, timeout=580)
    report = (tmp_path / "model_quality.md").read_text()
    assert "Scored through the editor pipeline" in report
    assert "| single-line | 18 | balanced_brackets |" in report
    raw = json.loads((tmp_path / "model_quality.json").read_text())
    assert set(raw) == {"diffusion", "AR twin"}
    for scored in raw.values():
        outcomes = scored["outcomes"]
        assert len(outcomes) == 18 and all(o["passed"] in (True, False) for o in outcomes)
        # blank answers are never counted as parsing or balanced
        assert all(o["completion"].strip() or not (o["parses"] or o["balanced"]) for o in outcomes)
    assert (tmp_path / "model_quality.png").stat().st_size > 1000


@pytest.mark.timeout(300)
@needs_humaneval
def test_a_perfect_model_passes_every_single_line_task_through_the_editor(tmp_path):
    """`--model NAME=reference` feeds each task's own answer through `dg_lsp.pipeline`: at HumanEval's
    cursors (column 0 of the line after the removed one) every single-line answer must come out as it went
    in and pass its tests. Before the fix to line_above's re-indentation, 8 of these 18 did not."""
    args = ["--spans", "0", "--single-every", "60", "--multi-every", "0", "--light-every", "0",
            "--through", "editor", "--workers", "1", "--max-tokens", "48", "--model", "perfect=reference",
            "--tasks-tokenizer", "dg_lsp/models/embedded_smollm2", "--out", str(tmp_path)]  # fmt: skip
    run_script("model_quality", args, timeout=280)
    (scored,) = json.loads((tmp_path / "model_quality.json").read_text()).values()
    outcomes = scored["outcomes"]
    assert len(outcomes) == 18
    assert [o["task_id"] for o in outcomes if not o["passed"]] == []
    assert all(o["line_exact"] for o in outcomes)


@pytest.mark.timeout(600)
@needs_humaneval
def test_sampler_sweep_compares_settings_on_the_same_tasks(tmp_path):
    """Two sampler settings of the shipped diffusion model through the editor, collected in one table."""
    args = ["--spans", "0", "--single-every", "120", "--multi-every", "0", "--light-every", "0",
            "--setting", "block4=blockLength=4", "--out", str(tmp_path)]  # fmt: skip
    run_script("sampler_sweep", args, timeout=580)
    raw = json.loads((tmp_path / "sampler_sweep.json").read_text())
    assert raw["settings"] == {"default": [], "block4": ["blockLength=4"]}
    default, block4 = (raw["results"][name]["single-line"] for name in ("default", "block4"))
    assert default["tasks"] == block4["tasks"] == 9
    untimed = [{k: v for k, v in s.items() if k != "mean_ms"} for s in (default, block4)]
    assert untimed[0] != untimed[1]  # the option reached the sampler
    report = (tmp_path / "sampler_sweep.md").read_text()
    assert "| single-line (9) | shown |" in report
    assert (tmp_path / "sampler_sweep.png").stat().st_size > 1000
