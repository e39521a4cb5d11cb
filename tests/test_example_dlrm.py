"""examples/dlrm.py's table and its optional peer: without torchao the PT2E row is skipped, saying how to
install it, and the table is built from the contenders there are (no tuning: `ours` is the slow tests' part)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "dlrm.py"


@pytest.fixture(scope="module")
def dlrm() -> Any:
    spec = importlib.util.spec_from_file_location("dlrm_example_table", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["dlrm_example_table"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tiny(dlrm: Any) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = dlrm.DLRM(table_rows=(50, 40, 30), dim=8, bottom=(16,), top=(32, 16, 1)).eval()
    return model, dlrm.make_batch(model, 16, (2, 2))


def test_without_torchao_the_pt2e_row_is_skipped_with_the_install_line(dlrm, tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao raises ImportError
    peer = dlrm.pt2e_int8(*tiny)
    assert peer.model is None and peer.name == dlrm.PT2E
    assert peer.skipped.startswith("torchao is not installed") and "pip install --no-deps torchao==" in peer.skipped


def test_the_table_has_a_row_per_built_contender_and_a_line_per_skipped_one(dlrm, tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)
    model, example = tiny
    same = lambda *a: model(*a)  # noqa: E731 -- a contender with eager's outputs
    nudged = lambda *a: model(*a) + 1e-3  # noqa: E731 -- one whose outputs differ by 1e-3
    every = [dlrm.Contender("eager", model), dlrm.Contender("torch.compile", skipped="skipped (--no-compile)"),
             dlrm.pt2e_int8(model, example), dlrm.Contender("ours int8", nudged, 12.0, note="1 fp32")]
    built = [c for c in every if c.model is not None]
    held_out = [dlrm.make_batch(model, 16, (2, 2), seed=s) for s in (1, 2)]
    rows = dlrm.measure(built + [dlrm.Contender("same", same)], [example], held_out, rounds=1, seconds=0.002,
                        repeated=True)
    assert [r.name for r in rows] == ["eager", "ours int8", "same"]
    assert rows[0].error == 0 and rows[2].error == 0 and rows[1].error == pytest.approx(1e-3, rel=1e-3)
    assert all(r.fresh_s > 0 and r.repeated_s is not None and r.repeated_s > 0 for r in rows)
    text = dlrm.table("2 indices per bag", rows, [c for c in every if c.model is None]).splitlines()
    assert text[0] == "### 2 indices per bag"
    assert text[2].startswith("| contender | fresh ms | x eager | repeated ms | x eager |")
    assert text[4].startswith("| eager |") and "| 1.00 |" in text[4]
    assert text[5].startswith("| ours int8 (1 fp32) |") and text[5].endswith("| 1.0e-03 | 12 |")
    assert text[7] == "- torch.compile: skipped (--no-compile)"
    assert text[8].startswith(f"- {dlrm.PT2E}: torchao is not installed")
    # without --repeated (make tune's default) only the fresh cycle is timed, and the table has no such columns
    fresh_only = dlrm.measure(built, [example], held_out, rounds=1, seconds=0.002)
    assert all(r.repeated_s is None for r in fresh_only)
    text = dlrm.table("2 indices per bag", fresh_only, []).splitlines()
    assert text[2] == "| contender | fresh ms | x eager | max \\|out - eager\\| (test batches) | build s |"
    assert text[3] == "|---|---|---|---|---|" and text[5].startswith("| ours int8 (1 fp32) |")
    assert text[5].endswith("| 1.0e-03 | 12 |")


def test_the_command_line(dlrm):
    args = dlrm.parse([])
    assert args.pooling == [1, 8] and args.fresh == 8 and args.held_out == 2 and args.compile and args.pt2e
    args = dlrm.parse(["--pooling", "8", "--no-max-autotune", "--fresh", "1"])
    assert args.pooling == [8] and not args.max_autotune and args.fresh == 1
    with pytest.raises(SystemExit):
        dlrm.parse(["--pooling", "0"])


def test_the_allocator_is_left_as_the_process_has_it_when_asked(dlrm, monkeypatch):
    """--system-allocator keeps malloc's defaults; without it every contender's memory is kept alike
    (autotune.allocator, pinned by tests/test_allocator.py)."""
    import autotune.allocator

    monkeypatch.setattr(autotune.allocator, "keep_freed_memory", lambda: "kept")
    assert not dlrm.parse([]).system_allocator and dlrm.allocator(dlrm.parse([])) == "kept"
    assert dlrm.allocator(dlrm.parse(["--system-allocator"])) == "as the process has it (--system-allocator)"


def test_the_summary_puts_the_poolings_side_by_side_with_notes_and_errors(dlrm):
    row = lambda name, ms, err, note="": dlrm.Row(name, ms / 1e3, ms / 1e3, err, 0.0, note)  # noqa: E731
    one = [row("eager", 16.0, 0.0), row("ours int8", 4.0, 1.2e-3)]
    eight = [row("eager", 18.0, 0.0), row("ours int8", 6.0, 3.7e-3, "top.2 in bf16")]
    text = dlrm.summary({1: (one, [dlrm.Contender("torch.compile", skipped="--no-compile")]), 8: (eight, [])})
    lines = text.splitlines()
    assert lines[0] == ("| contender | 1 per bag, ms | x eager | 8 per bag, ms | x eager | "
                        "max \\|out - eager\\| test (1 / 8) |")
    assert lines[1].count("|---") == 6
    assert lines[2] == "| eager | 16.00 | 1.00 | 18.00 | 1.00 | 0.0e+00 / 0.0e+00 |"
    assert lines[3] == "| ours int8 (8 per bag: top.2 in bf16) | 4.00 | 4.00 | 6.00 | 3.00 | 1.2e-03 / 3.7e-03 |"
    assert lines[-1] == "- torch.compile: --no-compile"


def test_the_summary_is_printed_and_written_stamped_with_its_run(dlrm, tmp_path, capsys):
    import argparse

    from autotune.provenance import read_stamp

    dlrm.write_summary("| a | table |", argparse.Namespace(log_dir=str(tmp_path / "logs")))
    text = (tmp_path / "logs" / "summary.md").read_text()
    s = read_stamp(text)
    assert s.cpu.startswith("cpu:") and s.commit and text.rstrip().endswith("| a | table |")
    assert text in capsys.readouterr().out
