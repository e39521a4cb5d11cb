"""benchmarks/batch_sizes.py: a model tuned at one batch size, timed at others against eager."""

import pytest

from benchmarks import batch_sizes as bench


def test_per_call_times_each_batch_of_the_cycle_at_least_once():
    seen = []
    median = bench.per_call(lambda x: seen.append(x), [(1,), (2,), (3,)], seconds=0.0)
    assert seen == [1, 2, 3] and median >= 0


@pytest.mark.parametrize("flags", [["--sizes", "64", "0"], ["--tune-batch", "0"], ["--max-rows", "0"],
                                   ["--trials", "0"], ["--fresh", "0"], ["--rounds", "0"]])
def test_values_below_one_are_refused_saying_why(flags, capsys):
    with pytest.raises(SystemExit):
        bench.main(flags)
    assert "take values >= 1" in capsys.readouterr().err


def test_the_float32_state_contender_is_tuned_with_a_match_per_cross_layer_and_the_rule_restored():
    from search_spaces.qmatmul import graph

    seen = []
    before = graph.MIN_NETWORK_LAYERS
    assert bench.float32_state(lambda: seen.append(graph.MIN_NETWORK_LAYERS) or "model") == "model"
    assert seen[0] > 1000 and graph.MIN_NETWORK_LAYERS == before


def test_the_float32_state_contender_is_refused_beside_fp32_saying_why(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--fp32", "--float32-state"])
    assert "--float32-state compares int8 models" in capsys.readouterr().err


def test_an_against_directory_without_the_models_logs_is_refused_saying_where_it_looked(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--model", "dcn", "--against", str(tmp_path)])
    assert f"no {tmp_path}/dcn" in capsys.readouterr().err
