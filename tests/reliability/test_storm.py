"""A short typing storm in CI: behaviour only (the minute-long one with figures is a benchmark).

Every request is answered, the worker queue stays bounded, the server survives, and at the end its
text is exactly the client's.
"""

from __future__ import annotations

import re

from tests.reliability.conftest import raw_server
from tests.reliability.storm import run_storm


def test_typing_storm_keeps_queue_bounded_and_text_exact(tmp_path, tiny_model_dir):
    options = {"dgLsp": {"model": str(tiny_model_dir), "maxTokens": 32, "denoisingSteps": 16}}
    with raw_server(tmp_path / "server.log", options) as server:
        result = run_storm(server, seconds=12, keys_per_s=25, seed=1)
        figures = result.summary()
        print(f"storm: {figures}")
        assert result.answered == result.requests
        assert result.edits > 50 and result.cancels > 0
        # Stale requests are answered (empty) instead of piling up behind the model.
        assert result.max_outstanding < result.requests / 4, figures
        assert result.superseded_empty > 0, figures  # (exact shares are timing: see the benchmark)
        assert server.shutdown() == 0
        peak = int(re.search(r"peak queue (\d+)", server.log_text()).group(1))
        assert 1 <= peak <= 2  # one job per document (plus one code action), however fast the typing
