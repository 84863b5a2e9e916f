"""Parallel commit rules on hand-built beliefs, and the masked sampler using them on a real tiny model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dg_lsp.engine import commit


def _view(top1: list[float], top2: list[float] | None = None, ent: list[float] | None = None, eligible=None):
    t1 = torch.tensor([top1])
    t2 = torch.tensor([top2]) if top2 is not None else (1 - t1) / 2
    h = torch.tensor([ent]) if ent is not None else -(t1 * t1.log())
    el = torch.tensor([eligible]) if eligible is not None else torch.ones_like(t1, dtype=torch.bool)
    return commit.StepView(torch.stack([t1, t2], dim=-1), h, el)


def test_threshold_commits_every_eligible_position_above_it():
    v = _view([0.95, 0.5, 0.91, 0.99], eligible=[True, True, True, False])
    assert commit.threshold_rule(0.9)(v).tolist() == [[True, False, True, False]]


def test_factor_rule_takes_the_largest_n_with_n_plus_one_times_error_below_f():
    # sorted confidences 0.99, 0.8, 0.7, 0.2: n=1: 2*0.01=0.02<1; n=2: 3*0.2=0.6<1; n=3: 4*0.3=1.2; n=4: 5*0.8
    v = _view([0.7, 0.99, 0.2, 0.8])
    assert commit.factor_rule(1.0)(v).tolist() == [[False, True, False, True]]
    # a looser factor admits the third; nothing passes when even the surest fails
    assert commit.factor_rule(1.5)(v).tolist() == [[True, True, False, True]]
    assert not commit.factor_rule(0.01)(_view([0.5, 0.4])).any()


def test_entropy_rule_bounds_the_sum_of_all_but_the_largest_entropy():
    v = _view([0.5] * 4, ent=[0.1, 0.3, 0.05, 2.0], eligible=[True, True, True, True])
    # sorted 0.05, 0.1, 0.3, 2.0: cumulative minus current = 0, 0.05, 0.15, 0.45
    assert commit.entropy_rule(0.1)(v).tolist() == [[True, False, True, False]]
    assert commit.entropy_rule(0.2)(v).tolist() == [[True, True, True, False]]
    assert commit.entropy_rule(1.0)(v).all()


def test_prophet_commits_everything_once_every_position_leads_by_the_gap():
    sure = _view([0.9, 0.8], top2=[0.05, 0.1])
    assert commit.prophet_rule(0.6)(sure).all()
    unsure = _view([0.9, 0.5], top2=[0.05, 0.4])
    assert not commit.prophet_rule(0.6)(unsure).any()


def test_rules_parse_with_defaults_and_reject_bad_entries():
    assert commit.parse_rules("factor,threshold:0.8") == [("factor", 1.0), ("threshold", 0.8)]
    with pytest.raises(ValueError, match="unknown commit rule 'fast'"):
        commit.parse_rules(["fast"])
    with pytest.raises(ValueError, match="finite"):
        commit.parse_rules(["factor:inf"])


def test_select_is_the_union_of_the_quota_and_the_rules():
    v = _view([0.95, 0.2, 0.3], eligible=[True, True, False])
    quota = torch.tensor([[False, True, True]])
    chosen = commit.select(v, commit.build([("threshold", 0.9)]), quota)
    assert chosen.tolist() == [[True, True, False]]  # never an ineligible position


def test_masked_engine_reports_its_commit_rules(tiny_masked_dir):
    from dg_lsp.engine.masked import MaskedDiffusionEngine, MaskedSamplerConfig

    engine = MaskedDiffusionEngine(
        tiny_masked_dir,
        sampler=MaskedSamplerConfig.from_options(
            {"masked": {"commit": ["factor:1.5", "threshold"], "threshold": 0.8}}
        ),
    )
    assert engine.describe()["commit"] == "factor:1.5,threshold:0.8"
    with pytest.raises(ValueError, match="unknown commit rule"):
        MaskedSamplerConfig.from_options({"masked": {"commit": "nope"}})
    spelled = MaskedSamplerConfig.from_options({"masked": {"commit": "threshold, copy:2"}})
    assert spelled.commit == ("threshold", "copy:2")  # the comma-separated form the setting documents


def _copy_view(pred, masked, canvas=None, eligible=None, around=None):
    p = torch.tensor([pred])
    m = torch.tensor([masked])
    c = torch.tensor([canvas]) if canvas is not None else torch.zeros_like(p)
    el = torch.tensor([eligible]) if eligible is not None else m.clone()
    return commit.StepView(torch.ones(1, len(pred), 2) / 2, None, el, None, p, c, m, around)


def test_copy_commits_the_run_of_guesses_that_continue_the_prompts_ngrams():
    around = [commit.Surroundings(source=(1, 2, 3, 4, 5, 6, 7), lead=(1, 2))]
    rule = commit.copy_rule(3)
    # (1,2|3) (2,3|4) (3,4|5) occur in the prompt, (4,5|9) does not: the run ends there
    v = _copy_view([3, 4, 5, 9, 6], [True] * 5, around=around)
    assert rule(v).tolist() == [[True, True, True, False, False]]
    # committed tokens take part in the n-grams; only masked positions are picked
    v = _copy_view([0, 4, 5, 6, 0], [False, True, True, True, True], canvas=[3, 0, 0, 0, 0], around=around)
    assert rule(v).tolist() == [[False, True, True, True, False]]
    # a position the sampler may not commit now (a stop away from the frontier) ends the run
    v = _copy_view([3, 4, 5], [True] * 3, eligible=[True, False, True], around=around)
    assert rule(v).tolist() == [[True, False, False]]
    # a longer n-gram asks for more: (1,2,3|9)... and no prompt, nothing
    assert not commit.copy_rule(4)(_copy_view([9, 4], [True, True], around=around)).any()
    assert not rule(_copy_view([3, 4], [True, True])).any()
    assert commit.parse_rules("threshold,copy") == [("threshold", 0.9), ("copy", 3.0)]


def test_copy_lets_the_shipped_model_retype_a_line_in_fewer_passes():
    """At a cursor whose line repeats one above it, the copy rule commits several tokens in a pass and the
    completion is the one decoding left to right gives."""
    from dg_lsp.engine.loader import EMBEDDED_DIR
    from dg_lsp.engine.masked import MaskedDiffusionEngine
    from dg_lsp.engine.types import InfillRequest

    engine = MaskedDiffusionEngine(EMBEDDED_DIR, use_continuation_cache=False)
    engine.use_prompt_cache = False
    assert engine.surroundings([1, 2], 1, 1) is None  # no rule reads the prompt: nothing is built
    prefix = (
        "def save(self, key, value):\n"
        "    self.root.mkdir(parents=True, exist_ok=True)\n"
        "    self.path(key).write_text(json.dumps(value))\n\n"
        "def save_all(self, items):\n"
        "    self.root.mkdir("
    )
    request = InfillRequest(prefix, "\n", max_tokens=16, single_line=True)
    plain = engine.infill(request)
    plain_commits = list(engine.last_commits)
    engine.cfg = dataclasses.replace(engine.cfg, commit=("threshold", "copy"))
    copied = engine.infill(request)
    assert copied.candidates[0].text == plain.candidates[0].text == "parents=True, exist_ok=True)"
    assert sum(n > 1 for n in engine.last_commits) > sum(n > 1 for n in plain_commits)
    assert copied.stats.forward_passes < plain.stats.forward_passes


def _run_view(top1, masked, eligible=None):
    t1, m = torch.tensor(top1), torch.tensor(masked)
    el = torch.tensor(eligible) if eligible is not None else m.clone()
    return commit.StepView(torch.stack([t1, (1 - t1) / 2], dim=-1), None, el, None, None, None, m)


def test_run_commits_the_sure_masks_right_after_the_frontier_up_to_the_first_unsure_one():
    rule = commit.run_rule(0.7)
    f, t = False, True
    # row 0: frontier 1 (left to the quota), then 0.8 and 0.75 sure, 0.5 ends the run, 0.9 after it waits
    # row 1: frontier 0; position 2 was committed earlier and carries the run on to position 3
    v = _run_view(
        [[1.0, 0.3, 0.8, 0.75, 0.5, 0.9], [0.2, 0.9, 1.0, 0.95, 0.1, 0.1]],
        [[f, t, t, t, t, t], [t, t, f, t, t, t]],
    )
    assert rule(v).tolist() == [[f, f, t, t, f, f], [f, t, f, t, f, f]]
    # a mask the rules may not choose (a stop away from the frontier) ends the run however sure it is
    v = _run_view([[0.2, 0.9, 0.99]], [[t, t, t]], eligible=[[t, f, t]])
    assert not rule(v).any()
    assert commit.parse_rules("threshold,run") == [("threshold", 0.9), ("run", 0.7)]
