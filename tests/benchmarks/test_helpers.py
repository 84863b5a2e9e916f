"""Pure helpers of the benchmark scripts: how a prefix-only continuation becomes an infill, percentiles."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import common
import peers


def test_single_line_infill_stops_after_the_first_newline():
    text = "        return a + b\n    return None\n\ndef other():\n"
    assert peers.cut_continuation(text, "\n\ndef main():\n", single_line=True) == "        return a + b\n"


def test_continuation_stops_where_it_starts_repeating_the_suffix():
    suffix = "    return result\n\n\ndef g():\n    pass\n"
    text = "    result = [x * 2 for x in xs]\n    return result\n\n\ndef g():\n"
    assert peers.cut_continuation(text, suffix, single_line=False) == "    result = [x * 2 for x in xs]\n"
    # repeating the suffix from the very start means an empty infill
    assert peers.cut_continuation("    return result\n", suffix, single_line=False) == ""


def test_continuation_stops_at_a_new_top_level_statement_when_the_suffix_is_not_repeated():
    text = "    total = sum(xs)\n    return total\n\ndef unrelated():\n    pass\n"
    assert peers.cut_continuation(text, "", single_line=False) == "    total = sum(xs)\n    return total\n\n"


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert common.percentile(values, 50) == 50.0
    assert common.percentile(values, 95) == 95.0
    assert common.percentile(values, 99) == 99.0
    assert common.percentile([7.0], 99) == 7.0
    assert common.percentile([], 50) != common.percentile([], 50)  # NaN for no values
