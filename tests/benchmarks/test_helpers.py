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


def test_keeps_parsing_compares_against_the_reference_middle():
    import model_quality as mq

    task = mq.Task("single-line", "t", "def f(a, b):\n", "\n\nprint(f(1, 2))\n", "    return a + b\n")
    lang = mq.task_language(task)
    assert lang == "python"
    assert mq.keeps_parsing(task, "    return a * b\n", lang)
    assert not mq.keeps_parsing(task, "    return (a +\n", lang)
    # a window cut out of a JavaScript file: judged by the grammar that fits it, relative to its reference
    window = mq.Task("held-out", "h", "function add(a, b) {\n  const s = ", "\n  return s;\n}\n", "a + b;")
    assert mq.task_language(window) == "javascript"
    assert mq.keeps_parsing(window, "b + a;", "javascript")
    assert not mq.keeps_parsing(window, "(a + ;", "javascript")


def test_context_identifiers_count_names_from_the_surrounding_code():
    import model_quality as mq

    prefix = "def read_lines(path):\n    with open(path) as fh:\n        lines = fh.readlines()\n"
    suffix = "\n    return result\n"
    # keywords and builtins (return, len, print) are left out of both counts
    assert mq.context_identifiers("    result = [len(x) for x in lines]\n", prefix, suffix) == (
        2,
        4,
    )  # result, lines; x twice
    assert mq.context_identifiers("    return ifyOSErrorrv behavi\n", prefix, suffix) == (0, 2)
    assert mq.context_identifiers("", prefix, suffix) == (0, 0)
    assert mq.context_identifiers("console.log(fh)", prefix, suffix) == (
        1,
        2,
    )  # log is a name, console is not


def test_balanced_brackets_compares_against_the_reference_middle():
    import model_quality as mq

    task = mq.Task("single-line", "t", "def f(xs):\n    return sum(", ")\n", "x * 2 for x in xs")
    assert mq.balanced_brackets(task, "len(xs)", "python")
    assert not mq.balanced_brackets(task, "len(xs", "python")  # leaves one more open
    assert not mq.balanced_brackets(task, "xs))", "python")  # closes what the suffix closes
    assert mq.balanced_brackets(task, "'(' * 3", "python")  # brackets in strings do not count
    # a window that does not balance on its own is judged against its reference
    window = mq.Task("held-out", "h", "  if (ok) {\n    run(", ");\n", "a, [b]")
    assert mq.balanced_brackets(window, "x", "javascript")
    assert not mq.balanced_brackets(window, "x]", "javascript")


def test_single_line_infill_skips_leading_blank_lines():
    assert peers.cut_continuation("\n    x = 1\n    y = 2\n", "", single_line=True) == "\n    x = 1\n"
    assert peers.cut_continuation("\n   ", "", single_line=True) == "\n   "  # no code line yet: keep going


def test_model_quality_gives_engines_the_servers_prompt_budget():
    """The quality figures are what a user's server would show: its engines are built with their default
    prompt budget (cut to the model's trained window), not the 192 tokens the held-out windows are drawn
    with. Before stop 43 they got the 192 and scored the embedded model 3 points low on HumanEval."""
    import inspect

    import model_quality

    from dg_lsp.engine.ar import AutoregressiveEngine
    from dg_lsp.engine.masked import MaskedDiffusionEngine

    for engine in (MaskedDiffusionEngine, AutoregressiveEngine):
        default = inspect.signature(engine.__init__).parameters["max_prompt_tokens"].default
        assert default == model_quality.SERVER_PROMPT_TOKENS, engine.__name__
    args = model_quality.argparse.Namespace(prompt_tokens=192, engine_prompt_tokens=0)
    assert model_quality.engine_budget(args) == model_quality.SERVER_PROMPT_TOKENS
    args.engine_prompt_tokens = 192  # repeating an earlier run
    assert model_quality.engine_budget(args) == 192
