"""Strategies and feature sets are declared once (`search.STRATEGIES`, `cost_model.FEATURE_SETS`): the CLI, `tune`
and the benchmarks read them from there."""

import inspect

import pytest

from autotune import cli, search, tuner
from autotune.search import STRATEGIES, Strategy
from autotune.task import make_task
from cost_model import FEATURE_SETS, TUNE_FEATURE_SETS
from cost_model.features import resolve_feature_set, uses_knobs, uses_program

SHAPE = "rows=400,dim=16,batch=32,pooling=0-12"


def _greedy(space, seen, n, rng, score=None, elites=(), *, width=3):
    _greedy.calls.append((n, score is not None, width))
    return []  # nothing to measure: tune stops before building anything


_greedy.calls = []


@pytest.fixture
def greedy(monkeypatch):
    _greedy.calls.clear()
    s = Strategy("greedy", _greedy, "a test's strategy", default_batch=5, options={"width": "how wide"})
    monkeypatch.setitem(STRATEGIES, "greedy", s)
    return s


def test_a_registered_strategy_is_a_cli_choice_and_sets_tunes_batch(greedy, tmp_path, capsys):
    args = cli._parser().parse_args(["tune", "embedding_bag", "--shape", SHAPE, "--strategy", "greedy"])
    assert args.strategy == "greedy"
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["tune", "embedding_bag", "--shape", SHAPE, "--help"])
    assert "greedy: a test's strategy (batch 5)" in " ".join(capsys.readouterr().out.split())
    assert tuner.DEFAULT_BATCH["greedy"] == 5

    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    res = tuner.tune(task, trials=12, log=tmp_path / "g.jsonl", strategy="greedy", progress=False,
                     builder=object(), runner=object(), options={"width": 7})
    assert res.measured == 0 and _greedy.calls == [(5, False, 7)]  # its batch, no model, its option


def test_an_unknown_option_names_the_declared_ones(greedy, tmp_path):
    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    with pytest.raises(ValueError, match=r"strategy options \['depth'\] are not options of _greedy; "
                                         r"greedy's options: width"):
        tuner.tune(task, trials=1, log=tmp_path / "g.jsonl", strategy="greedy", options={"depth": 2},
                   progress=False, builder=object(), runner=object())
    with pytest.raises(ValueError, match="xgb's options: epsilon, pool, diversity, design"):
        tuner.check_strategy_options("xgb", {"epsilonn": 0.2}, task.space)
    with pytest.raises(ValueError, match="unknown strategy 'nope'; known: xgb, annealing, random, greedy"):
        tuner.check_strategy_options("nope", {}, task.space)


def test_declarations_agree_with_the_functions_and_the_old_tables():
    assert {n: s.default_batch for n, s in STRATEGIES.items()} == {"xgb": 4, "annealing": 16, "random": 16}
    assert [n for n, s in STRATEGIES.items() if s.needs_model] == ["xgb", "annealing"]
    for s in STRATEGIES.values():
        params = inspect.signature(s.propose).parameters
        assert s.defaults == {o: params[o].default for o in s.options}
        assert not {"score", "elites", "candidates", "rerank"} & set(s.options)  # the tuner's, not the user's
    assert STRATEGIES["random"].propose is search.random_search and STRATEGIES["xgb"].propose is search.model_search
    with pytest.raises(TypeError, match="not keyword arguments with a default"):
        Strategy("bad", _greedy, "x", options={"depth": "no such argument"})


def test_feature_sets_are_declared_once():
    assert tuple(FEATURE_SETS) == ("knobs", "program", "all") and TUNE_FEATURE_SETS == ("auto", *FEATURE_SETS)
    assert [(uses_knobs(f), uses_program(f)) for f in FEATURE_SETS] == [(True, False), (False, True), (True, True)]
    assert not uses_knobs("pixels") and resolve_feature_set("auto") == tuner.AUTO_FEATURES == "all"
    with pytest.raises(ValueError, match="unknown feature set 'knob'; known: auto, knobs, program, all"):
        resolve_feature_set("knob")
    tune_args = ["tune", "embedding_bag", "--shape", SHAPE]
    assert cli._parser().parse_args(tune_args).features == "auto"
    assert [cli._parser().parse_args([*tune_args, "--features", f]).features for f in TUNE_FEATURE_SETS] \
        == list(TUNE_FEATURE_SETS)
