"""benchmarks/compare_runs.py's arguments: a run is NAME=DIR of an existing directory, and --shipped names runs."""

from __future__ import annotations

import pytest

from benchmarks import compare_runs


def test_runs_are_named_directories_and_shipped_names_a_run(tmp_path, capsys):
    args = compare_runs.parse(["--run", f"a={tmp_path}", "--run", f"b={tmp_path}", "--shipped", "b"])
    assert list(args.runs) == ["a", "b"] and args.runs["a"] == tmp_path and args.shipped == ["b"]
    for bad, why in ((["--run", str(tmp_path)], "--run takes NAME=DIR"),
                     (["--run", f"a={tmp_path / 'missing'}"], "is not a directory"),
                     (["--run", f"a={tmp_path}", "--shipped", "c"], "--shipped names no --run: c")):
        with pytest.raises(SystemExit):
            compare_runs.parse(bad)
        assert why in capsys.readouterr().err
