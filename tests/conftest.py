from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A real, randomly initialised tiny DiffusionGemma checkpoint with a real tokenizer."""
    import torch

    from dg_lsp.models.tiny import make_tiny_diffusion_gemma

    torch.set_num_threads(1)
    return make_tiny_diffusion_gemma(tmp_path_factory.mktemp("tiny-dg"))


# Long runs that README command 2 (`python -m pytest -q`) leaves out so it stays within 10 minutes on
# 2 cores; `.ci/run` runs them on top (`python -m pytest -q -m slow`). Marked here by test id rather
# than in the files, which other owners edit. Seconds from one run on the shared 2-core machine.
SLOW_TESTS = (
    "tests/benchmarks/test_smoke.py::test_smoke_mode_writes_report",  # 3 scripts, 22-40 s each
    "tests/benchmarks/test_smoke.py::test_model_quality_scores_what_the_editor_shows",  # 37 s
    "tests/benchmarks/test_smoke.py::test_sampler_sweep_compares_settings_on_the_same_tasks",  # 27 s
    "tests/reliability/test_faults.py::test_client_killed_mid_request_leaves_no_process",  # 61 s
    "tests/reliability/test_faults.py::test_out_of_memory_during_a_step_then_stdin_closed",  # 19 s
    # 16 s
    "tests/reliability/test_faults.py::test_broken_model_files_are_reported_once_and_the_server_recovers",
    "tests/reliability/test_storm.py::test_typing_storm_keeps_queue_bounded_and_text_exact",  # 26 s
    "tests/reliability/test_protocol_fuzz.py::test_fuzz_protocol_keeps_serving",  # 40 s with set-up
    "tests/editors/test_install.py::test_the_wheel_carries_the_embedded_model_and_the_example",  # 20-60 s
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: long reliability and benchmark runs; deselected by default, `-m slow` runs them"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.split("[")[0] in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
