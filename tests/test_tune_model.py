"""tune_model and the graph engine under it: capture, discover, rewrite checked by numbers, profile.

The engine tests use rules of their own (no tuning, no TVM): a correct one, a wrong one, one that raises, one
that cannot be built, one whose kernel is missing. The end-to-end tests (`slow`: they tune and compile kernels,
2 trials per task) run the operators' rules on a tiny DLRM (3 tables, dim 16, batch 8).
"""

from __future__ import annotations

import dataclasses
import operator
import time
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import autotune.torch as at
from autotune.torch import graph as G
from autotune.torch import profiling
from search_spaces.template import GraphMatch, GraphRule, Kept

aten = torch.ops.aten
BATCH = 8


class Interaction(nn.Module):
    """DLRM's dot interaction, as facebookresearch/dlrm writes it."""

    def forward(self, x: torch.Tensor, ly: list[torch.Tensor]) -> torch.Tensor:
        t = torch.cat([x] + ly, dim=1).view(x.shape[0], -1, x.shape[1])
        z = torch.bmm(t, t.transpose(1, 2))
        li, lj = torch.tril_indices(t.shape[1], t.shape[1], offset=-1, device=x.device)
        return torch.cat([x, z[:, li, lj]], dim=1)


class TinyDLRM(nn.Module):
    """3 small tables of dim 16; the bottom MLP's 32 -> 16 layer is wide enough for int8 (the others are not)."""

    def __init__(self, rows: tuple[int, ...] = (50, 30, 20), dim: int = 16, dense: int = 5):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 32), nn.ReLU(), nn.Linear(32, dim), nn.ReLU())
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(r, dim, mode="sum") for r in rows)
        self.interaction = Interaction()
        t = len(rows)
        self.top = nn.Sequential(nn.Linear(dim + t * (t + 1) // 2, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, dense: torch.Tensor, indices: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        ly = [e(i, o) for e, i, o in zip(self.embeddings, indices, offsets)]
        return torch.sigmoid(self.top(self.interaction(x, ly)))


def make_batch(model: TinyDLRM, batch: int, seed: int = 0) -> tuple[Any, ...]:
    """Dense features and, per table, bags of 1-3 random indices."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(batch, model.bottom[0].in_features, generator=g)
    indices, offsets = [], []
    for e in model.embeddings:
        sizes = torch.randint(1, 4, (batch,), generator=g)
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)[:-1]]))
        indices.append(torch.randint(0, e.num_embeddings, (int(sizes.sum()),), generator=g))
    return dense, indices, offsets


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny ops on a shared 2-core machine: a second OpenMP thread only waits for a busy core (and the suite
    runs TVM's kernels on one thread too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def model() -> TinyDLRM:
    torch.manual_seed(0)
    return TinyDLRM().eval()


def node_rule(name: str, target: Any, build: Callable[[Any, Any], Any],
              tolerance: tuple[float, float] = (1e-4, 1e-5)) -> GraphRule:
    """A rule replacing every call of `target` by `build(gm, node)` (the new output node)."""

    def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Any:
        for n in list(gm.graph.nodes):
            if n.op == "call_function" and n.target is target and n not in claimed:
                def replace(gm: Any, n: Any = n) -> tuple[Any, ...]:
                    with gm.graph.inserting_before(n.next):
                        return (build(gm, n),)

                yield GraphMatch(rule=name, nodes=(n,), outputs=(n,), tasks=(), replace=replace,
                                 tolerance=tolerance, where=G.module_path(n), what=f"{name} at {n.name}")

    return GraphRule(name, find)


def relu_to_clamp(gm: Any, n: Any) -> Any:  # the same function: must be kept
    return gm.graph.call_function(aten.clamp_min.default, (n.args[0], 0.0))


def sigmoid_to_tanh(gm: Any, n: Any) -> Any:  # a different function: must be refused
    return gm.graph.call_function(aten.tanh.default, (n.args[0],))


def _boom(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("kernel exploded")


def _wrong_shape(gm: Any, n: Any) -> Any:
    return gm.graph.call_function(aten.unsqueeze.default, (n, 0))


def _cannot_build(gm: Any, n: Any) -> Any:
    raise ValueError("no such layout")


def _graph_ops(gm: Any) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def tune(model: nn.Module, args: Any, tmp_path: Any, **kw: Any) -> tuple[Any, Any]:
    """tune_model with the engine's checks by numbers only (`require_speedup=False` unless a test asks): the
    test rules' replacements are no faster than the model's ops, and it is their wiring that is tested."""
    kw.setdefault("quantize", False)
    kw.setdefault("require_speedup", False)
    return at.tune_model(model, args, log_dir=tmp_path / "logs", progress=False, bench_rounds=1,
                         bench_seconds=0.02, **kw)


# ---- the engine, with rules of the test's own -------------------------------------------------------------------
def test_agreeing_replacements_are_wired_and_the_model_still_runs_everywhere(model, tmp_path):
    args = make_batch(model, BATCH)
    opt, report = tune(model, args, tmp_path, rules=[node_rule("relu", aten.relu.default, relu_to_clamp)])
    assert opt is not model
    assert [r.where for r in report.replaced] == ["bottom.1", "bottom.3", "top.1"]
    assert report.kept == [] and report.tasks == [] and report.measured == 0 and report.package is None
    ops = _graph_ops(opt)
    assert aten.relu.default not in ops and ops.count(aten.clamp_min.default) == 3
    assert any(n.op == "call_module" and n.target == "_guards_fn" for n in opt.graph.nodes)  # DCE kept it
    assert not any(n.target is operator.getitem and not n.users for n in opt.graph.nodes)
    assert report.max_abs_diff == 0.0 and report.eager_s > 0 and report.optimized_s > 0
    assert "replaced bottom.1" in str(report) and "eager" in str(report)
    other = make_batch(model, 13, seed=1)  # another batch size: the capture kept dim 0 dynamic
    with torch.inference_mode():
        torch.testing.assert_close(opt(*other), model(*other), rtol=0, atol=0)
    # (torch.compile of a rewritten graph: the end-to-end test, on the operators' own ops)
    # training keeps working through the rewritten graph: the parameters are the model's own
    opt(*args).sum().backward()
    assert model.bottom[0].weight.grad is not None and model.bottom[0].weight.grad.abs().sum() > 0


def test_a_replacement_that_disagrees_is_kept_and_says_by_how_much(model, tmp_path):
    args = make_batch(model, BATCH)
    rules = [node_rule("relu", aten.relu.default, relu_to_clamp),
             node_rule("sigmoid", aten.sigmoid.default, sigmoid_to_tanh)]
    opt, report = tune(model, args, tmp_path, rules=rules)
    assert {r.rule for r in report.replaced} == {"relu"}
    (kept,) = report.kept
    assert kept.rule == "sigmoid" and "disagrees" in kept.why and "max |new - old|" in kept.why
    assert aten.tanh.default not in _graph_ops(opt) and aten.sigmoid.default in _graph_ops(opt)
    with torch.inference_mode():
        torch.testing.assert_close(opt(*args), model(*args), rtol=0, atol=0)


def nudged(gm: Any, n: Any) -> Any:
    """The node's own op again, plus 1e-5."""
    same = gm.graph.call_function(n.target, n.args)
    return gm.graph.call_function(aten.add.Tensor, (same, 1e-5))


def test_the_match_tolerance_decides(model, tmp_path):
    """f(x) + 1e-5: within atol 1e-3 (the relus), outside atol 1e-7 (the sigmoid)."""
    rules = [node_rule("loose", aten.relu.default, nudged, tolerance=(0.0, 1e-3)),
             node_rule("tight", aten.sigmoid.default, nudged, tolerance=(0.0, 1e-7))]
    opt, report = tune(model, make_batch(model, BATCH), tmp_path, rules=rules)
    assert [r.rule for r in report.replaced] == ["loose"] * 3
    assert all(0.9e-5 < r.max_error < 1.1e-5 for r in report.replaced)
    assert [k.rule for k in report.kept] == ["tight"] and "atol=1e-07" in report.kept[0].why


def test_a_replacement_that_fails_is_kept_with_the_reason(model, tmp_path):
    rules = [node_rule("raises", aten.sigmoid.default, lambda gm, n: gm.graph.call_function(_boom, (n.args[0],))),
             node_rule("shape", aten.bmm.default, _wrong_shape),
             node_rule("build", aten.transpose.int, _cannot_build)]
    opt, report = tune(model, make_batch(model, BATCH), tmp_path, rules=rules)
    assert opt is model and report.replaced == [] and "unchanged" in report.note
    why = {k.rule: k.why for k in report.kept}
    assert "raised RuntimeError: kernel exploded" in why["raises"]
    assert "the replacement gives torch.float32[1, 8, 4, 4] where the model has torch.float32[8, 4, 4]" in why["shape"]
    assert "could not be built: ValueError: no such layout" in why["build"]


def test_a_refused_replacement_leaves_no_nodes_or_buffers_behind(model):
    args = make_batch(model, BATCH)
    gm = G.capture(model, args)
    before = [n.name for n in gm.graph.nodes]

    def junk(gm: Any, n: Any) -> Any:
        gm.register_buffer("autotune_junk", torch.ones(1))
        c = gm.graph.get_attr("autotune_junk")
        return gm.graph.call_function(aten.mul.Tensor, (n, c))  # sigmoid * 1: agrees...

    def wrong_junk(gm: Any, n: Any) -> Any:
        gm.register_buffer("autotune_junk", torch.full((1,), 2.0))
        c = gm.graph.get_attr("autotune_junk")
        return gm.graph.call_function(aten.mul.Tensor, (n, c))  # ... sigmoid * 2 does not

    done = G.rewrite(gm, args, [node_rule("junk", aten.sigmoid.default, wrong_junk)])
    assert done.replaced == [] and len(done.kept) == 1
    assert [n.name for n in gm.graph.nodes if not n.name.startswith("getitem")] == \
        [n for n in before if not n.startswith("getitem")]
    assert not hasattr(gm, "autotune_junk")
    done = G.rewrite(gm, args, [node_rule("junk", aten.sigmoid.default, junk)])
    assert len(done.replaced) == 1 and isinstance(gm.autotune_junk, torch.Tensor)  # used: it stays


def fake_timer(old_s: float, new_s: float, calls: list[tuple[Any, Any]]) -> Callable[..., tuple[float, float]]:
    """`speed.time_pair` that runs both sides once (their values are checked) and reports the given times."""

    def time_pair(old: Any, new: Any, check: Any) -> tuple[float, float]:
        calls.append((old(), new()))
        return old_s, new_s

    return time_pair


def test_a_replacement_that_agrees_but_is_not_faster_is_kept_with_both_times(model, tmp_path, monkeypatch):
    from autotune.torch import speed

    args = make_batch(model, BATCH)
    rules = [node_rule("relu", aten.relu.default, relu_to_clamp)]
    check = at.SpeedCheck(rounds=1, seconds=0.001)
    calls: list[tuple[Any, Any]] = []
    monkeypatch.setattr(speed, "time_pair", fake_timer(8.1e-3, 11.9e-3, calls))
    opt, report = tune(model, args, tmp_path, rules=rules, require_speedup=True, speed=check)
    assert opt is model and report.replaced == [] and [k.where for k in report.kept] == ["bottom.1", "bottom.3",
                                                                                        "top.1"]
    assert "kept bottom.1 [relu]: not faster: 11.9 ms vs PyTorch 8.1 ms on the timed batches" in str(report)
    # each side ran its own code: the model's relu and the replacement's clamp_min, on the same example values
    assert len(calls) == 4 and all(len(o) == len(n) == 1 and torch.equal(o[0], n[0]) for o, n in calls[:3])
    # then the whole model, rewritten with them, against the model without: also slower, so kept out
    assert report.whole_model == ["relu: the model takes 11.9 ms with its replacements, 8.1 ms without: kept out"]
    assert aten.clamp_min.default not in _graph_ops(G.capture(model, args))

    monkeypatch.setattr(speed, "time_pair", fake_timer(1e-3, 0.98e-3, []))  # 2% faster: within the margin
    _, report = tune(model, args, tmp_path, rules=rules, require_speedup=True, speed=check)
    assert report.replaced == [] and all("at least 3% less time" in k.why for k in report.kept)

    monkeypatch.setattr(speed, "time_pair", fake_timer(1e-3, 0.5e-3, []))
    opt, report = tune(model, args, tmp_path, rules=rules, require_speedup=True, speed=check)
    assert [(r.old_s, r.new_s) for r in report.replaced] == [(1e-3, 0.5e-3)] * 3 and report.kept == []
    assert "replaced bottom.1: relu at relu (max |new - old| 0; 0.5 ms vs PyTorch 1 ms)" in str(report)
    assert aten.relu.default not in _graph_ops(opt)

    with pytest.raises(ValueError, match="require_speedup=False times none"):
        tune(model, args, tmp_path, rules=rules, speed=check)
    with pytest.raises(ValueError, match="margin"):
        at.SpeedCheck(margin=1.5)
    with pytest.raises(ValueError, match="model_rounds"):
        at.SpeedCheck(model_rounds=0)
    assert at.SpeedCheck(rounds=2, seconds=0.5).for_models() == at.SpeedCheck(rounds=9, seconds=0.5)


def test_replacements_slower_alone_are_wired_in_when_the_whole_model_is_faster_with_them(model, tmp_path,
                                                                                          monkeypatch):
    """A replacement's own subgraph misses what it does to its neighbours (the batched launch lets the
    interaction read its output in place): the whole model has the last word on what lost alone."""
    from autotune.torch import speed

    args = make_batch(model, BATCH)
    rules = [node_rule("relu", aten.relu.default, relu_to_clamp)]
    check = at.SpeedCheck(rounds=1, seconds=0.001)
    # each relu alone: slower; the model with them: faster; the model as given against the result: slower
    answers = iter([(1e-3, 2e-3)] * 3 + [(10e-3, 7e-3), (10e-3, 7e-3)])
    wholes: list[tuple[Any, Any]] = []

    def time_pair(old: Any, new: Any, c: Any) -> tuple[float, float]:
        o, n = old(), new()
        if not isinstance(o, tuple):  # the whole models (a match's subgraph returns a tuple)
            wholes.append((o, n))
        return next(answers)

    monkeypatch.setattr(speed, "time_pair", time_pair)
    opt, report = tune(model, args, tmp_path, rules=rules, require_speedup=True, speed=check)
    assert len(wholes) == 2 and all(torch.equal(*w) for w in wholes)  # both models ran, and agree
    assert [r.where for r in report.replaced] == ["bottom.1", "bottom.3", "top.1"] and report.kept == []
    assert aten.relu.default not in _graph_ops(opt) and aten.clamp_min.default in _graph_ops(opt)
    assert "whole-model check, relu: the model takes 7 ms with its replacements, 10 ms without: wired in" in str(report)


def test_a_rewrite_slower_than_the_model_as_given_is_not_returned(model, tmp_path, monkeypatch):
    """Each replacement wins its own check, but the rewritten model, timed whole against the model as given (its
    calling convention included, which on a tiny model costs more than its kernels save), is slower: the model
    comes back unchanged, and the report says both times. Faster by the margin, the rewrite is returned."""
    from autotune.torch import speed

    args = make_batch(model, BATCH)
    rules = [node_rule("relu", aten.relu.default, relu_to_clamp)]
    check = at.SpeedCheck(rounds=1, seconds=0.001)
    given: list[tuple[Any, Any]] = []

    def timer(given_s: float, rewritten_s: float) -> Callable[..., tuple[float, float]]:
        def time_pair(old: Any, new: Any, c: Any) -> tuple[float, float]:
            o, n = old(), new()
            if isinstance(o, tuple):  # a match's subgraph: each replacement is faster alone
                return 2e-3, 1e-3
            assert old.model is model and new.model is not model and c.rounds == check.model_rounds
            given.append((o, n))
            return given_s, rewritten_s

        return time_pair

    monkeypatch.setattr(speed, "time_pair", timer(1e-3, 1.7e-3))
    opt, report = tune(model, args, tmp_path, rules=rules, require_speedup=True, speed=check)
    assert opt is model and len(given) == 1 and torch.equal(*given[0])
    assert "the rewritten model is not 3% faster than the model as given; the model comes back unchanged" in \
        str(report)
    assert "whole-model check, the rewritten model takes 1.7 ms, the model as given 1 ms: the model as given is " \
        "returned" in str(report)
    monkeypatch.setattr(speed, "time_pair", timer(1e-3, 0.98e-3))  # 2% faster: within the margin
    opt, _ = tune(model, args, tmp_path, rules=rules, require_speedup=True, speed=check)
    assert opt is model

    monkeypatch.setattr(speed, "time_pair", timer(1e-3, 0.5e-3))
    opt, report = tune(model, args, tmp_path, rules=rules, require_speedup=True, speed=check)
    assert opt is not model and aten.relu.default not in _graph_ops(opt) and not report.note
    assert "the rewritten model takes 0.5 ms, the model as given 1 ms: returned" in str(report)


def relu_to_threshold(gm: Any, n: Any) -> Any:  # the same function, another op: the "fused" rule's
    return gm.graph.call_function(aten.threshold.default, (n.args[0], 0.0, 0.0))


def test_a_fusing_rule_is_kept_only_where_the_whole_model_is_faster_with_it(model, tmp_path, monkeypatch):
    """A rule that fuses others' sites (GraphRule.fuses, as the embedding bags + interaction kernel does):
    discovery lists what the fused rules would do there (their tasks are tuned too), and the model rewritten with
    the fusing rule is timed against the model rewritten without it, the fused rules taking its sites."""
    from autotune.torch import speed

    args = make_batch(model, BATCH)
    apart = node_rule("clamp", aten.relu.default, relu_to_clamp)
    fused = dataclasses.replace(node_rule("fused", aten.relu.default, relu_to_threshold), fuses=("clamp",))
    found = G.discover(G.capture(model, args), args, [fused, apart])
    assert [m.rule for m in found.matches] == ["fused"] * 3 and [m.rule for m in found.alternatives] == ["clamp"] * 3
    assert [m.nodes for m in found.matches] == [m.nodes for m in found.alternatives]
    assert G.discover(G.capture(model, args), args, [apart]).alternatives == []
    check = at.SpeedCheck(rounds=1, seconds=0.001)

    def whole_models(fused_s: float, apart_s: float, wholes: list[Any]) -> Callable[..., tuple[float, float]]:
        def time_pair(old: Any, new: Any, c: Any) -> tuple[float, float]:
            o, n = old(), new()
            if isinstance(o, tuple):  # a match's subgraph: each replacement is faster alone
                return 2e-3, 1e-3
            if old.model is model:  # the model as given, against the one tune_model returns: slower
                return 20e-3, 5e-3
            wholes.append((o, n))
            return fused_s, apart_s

        return time_pair

    wholes: list[Any] = []
    monkeypatch.setattr(speed, "time_pair", whole_models(10e-3, 7e-3, wholes))
    opt, report = tune(model, args, tmp_path, rules=[fused, apart], require_speedup=True, speed=check)
    assert len(wholes) == 1 and torch.equal(*wholes[0])  # both models ran, and agree
    assert {r.rule for r in report.replaced} == {"clamp"} and aten.threshold.default not in _graph_ops(opt)
    assert "whole-model check, fused: the model takes 10 ms with it, 7 ms with clamp apart: left out" in str(report)

    monkeypatch.setattr(speed, "time_pair", whole_models(6.9e-3, 7e-3, []))  # 1% faster: within the margin
    _, report = tune(model, args, tmp_path, rules=[fused, apart], require_speedup=True, speed=check)
    assert {r.rule for r in report.replaced} == {"clamp"}

    monkeypatch.setattr(speed, "time_pair", whole_models(5e-3, 7e-3, []))
    opt, report = tune(model, args, tmp_path, rules=[fused, apart], require_speedup=True, speed=check)
    assert {r.rule for r in report.replaced} == {"fused"} and aten.clamp_min.default not in _graph_ops(opt)
    assert "fused: the model takes 5 ms with it, 7 ms with clamp apart: kept" in str(report)


class _LaggingClock:
    """runtime's `time` for the tests of the speed check's real timer: the real clock plus `lag`, which a test's
    code moves instead of sleeping. A second of lag per call cannot be mistaken for a busy machine's noise."""

    def __init__(self) -> None:
        self.lag = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.lag


_CLOCK = _LaggingClock()


def _slow_sigmoid(x: torch.Tensor) -> torch.Tensor:
    _CLOCK.lag += 1.0
    return torch.sigmoid(x)


def test_the_speed_check_times_the_real_code_and_keeps_a_slower_replacement(model, monkeypatch):
    """The timer unpatched, its clock a second ahead for each call of the replacement (a sigmoid on 8 values
    otherwise): the speed check times the real code, and keeps the slower replacement out."""
    from autotune import runtime

    monkeypatch.setattr(runtime, "time", _CLOCK)
    args = make_batch(model, BATCH)
    gm = G.capture(model, args)
    rule = node_rule("slow", aten.sigmoid.default, lambda gm, n: gm.graph.call_function(_slow_sigmoid, n.args))
    done = G.rewrite(gm, args, [rule], speed=G.SpeedCheck(rounds=1, seconds=0.01))
    (kept,) = done.kept
    assert done.replaced == [] and kept.why.startswith("not faster: ")
    new_ms = float(kept.why.split()[2])
    assert new_ms >= 1000.0 and _slow_sigmoid not in _graph_ops(gm)


def test_a_replacement_is_timed_once_per_call_however_many_rewrites_meet_it(model, monkeypatch):
    """The precision ladder and the whole-model checks rewrite fresh copies of one capture again and again: a
    replacement met again (same sites, code, inputs and kernels) keeps its first timing; on other kernels it is
    timed again. The capture itself is never rewritten, and its copies keep its input checks."""
    from autotune.torch import speed
    from autotune.torch.capture import copy_captured

    args = make_batch(model, BATCH)
    captured = G.capture(model, args)
    rules = [node_rule("relu", aten.relu.default, relu_to_clamp)]
    check = G.SpeedCheck(rounds=1, seconds=0.001)
    calls: list[tuple[Any, Any]] = []
    monkeypatch.setattr(speed, "time_pair", fake_timer(1e-3, 0.5e-3, calls))
    kernels = {"now": "config a"}
    timings = speed.Timings(lambda match: kernels["now"])
    first = G.rewrite(copy_captured(captured), args, rules, speed=check, timings=timings)
    assert len(first.replaced) == 3 and len(calls) == 3 and len(timings) == 3
    copy = copy_captured(captured)
    again = G.rewrite(copy, args, rules, speed=check, timings=timings)
    assert len(calls) == 3 and [(r.where, r.old_s, r.new_s) for r in again.replaced] == \
        [(r.where, r.old_s, r.new_s) for r in first.replaced]
    kernels["now"] = "config b"
    G.rewrite(copy_captured(captured), args, rules, speed=check, timings=timings)
    assert len(calls) == 6 and len(timings) == 6
    assert aten.relu.default in _graph_ops(captured) and aten.relu.default not in _graph_ops(copy)
    assert dict(copy.named_parameters()).keys() == dict(captured.named_parameters()).keys()
    assert all(a is b for a, b in zip(copy.parameters(), captured.parameters()))
    dense, *rest = args
    with pytest.raises(Exception, match="Guard failed"):
        copy(dense[:, :-1], *rest)


def test_the_graphs_values_are_run_again_only_after_a_rule_changed_it(model, monkeypatch):
    args = make_batch(model, BATCH)
    gm = G.capture(model, args)
    runs: list[int] = []
    real = G.example_values
    monkeypatch.setattr(G, "example_values", lambda *a: runs.append(1) or real(*a))
    rules = [node_rule("none", aten.tanh.default, relu_to_clamp), node_rule("relu", aten.relu.default, relu_to_clamp),
             node_rule("none again", aten.tanh.default, relu_to_clamp),
             node_rule("refused", aten.sigmoid.default, sigmoid_to_tanh),
             node_rule("sigmoid", aten.sigmoid.default, lambda gm, n: gm.graph.call_function(torch.sigmoid, n.args))]
    done = G.rewrite(gm, args, rules)
    assert [r.rule for r in done.replaced] == ["relu"] * 3 + ["sigmoid"] and [k.rule for k in done.kept] == ["refused"]
    assert len(runs) == 2  # before the first rule and after "relu" replaced: not after the passes that changed nothing


def test_a_group_is_timed_as_a_whole_on_the_values_it_reads(model, monkeypatch):
    """The interaction's nodes as one subgraph: it reads x and the 3 embeddings and recomputes the rest."""
    from autotune import runtime
    from autotune.torch import speed

    args = make_batch(model, BATCH)
    gm = G.capture(model, args)
    interp = torch.fx.Interpreter(gm, garbage_collect_values=False)
    with torch.no_grad():
        interp.run(*G.flat_inputs(gm, args))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and G.module_path(n) == "interaction"]
    sub = speed.subgraph(gm, nodes, [nodes[-1]], interp.env)
    tensors = [v for v in sub.values if isinstance(v, torch.Tensor)]
    assert len(tensors) == 4 and tensors[0] is interp.env[nodes[0].args[0][0]]  # x, then e0, e1, e2
    assert [v for v in sub.values if not isinstance(v, torch.Tensor)] == [BATCH]  # the graph's batch symbol
    (out,) = sub()
    assert torch.equal(out, interp.env[nodes[-1]])
    monkeypatch.setattr(runtime, "time", _CLOCK)

    def lagging() -> None:
        _CLOCK.lag += 1.0

    old, new = speed.time_pair(lambda: None, lagging, G.SpeedCheck(rounds=2, seconds=0.01))
    assert new >= 1.0 > old


def test_time_pair_stops_once_the_rounds_decide_clearly(monkeypatch):
    """A verdict every round agrees on by a clear gap stops after `early_rounds`; a close one takes every round."""
    from autotune import bench
    from autotune.torch import speed

    def timer(new_over_old: list[float]) -> tuple[list[str], Callable[..., float]]:
        sides: list[str] = []

        def median_seconds(fn: Callable[[], Any], seconds: float) -> float:
            sides.append(fn())
            return 1e-3 if sides[-1] == "old" else 1e-3 * new_over_old[len(sides) // 2 - 1]
        return sides, median_seconds

    check = G.SpeedCheck(model_rounds=9).for_models()
    for ratios, rounds in [([0.7] * 9, 2), ([1.3] * 9, 2), ([0.7, 0.95] + [0.7] * 7, 9),
                           ([0.96] * 9, 9), ([0.7, 1.3] * 5, 9)]:
        sides, median_seconds = timer(ratios)
        monkeypatch.setattr(bench, "median_seconds", median_seconds)
        old, new = speed.time_pair(lambda: "old", lambda: "new", check)
        assert len(sides) == 2 * rounds and sides[:2] == ["old", "new"], (ratios, sides)
        assert old == 1e-3
    assert not G.SpeedCheck(early_rounds=3).decided([1.0, 1.0], [0.5, 0.5])  # too few rounds yet
    assert G.SpeedCheck(early_rounds=3).decided([1.0, 1.0, 1.0], [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="clear"):
        G.SpeedCheck(clear=-0.1)


def test_rewrite_refuses_what_ready_refuses_and_overlapping_matches(model):
    args = make_batch(model, BATCH)
    gm = G.capture(model, args)
    done = G.rewrite(gm, args, [node_rule("relu", aten.relu.default, relu_to_clamp)],
                     ready=lambda m: "missing kernel: none tuned" if m.where == "top.1" else None)
    assert [r.where for r in done.replaced] == ["bottom.1", "bottom.3"]
    assert done.kept == [Kept("relu", "top.1", "missing kernel: none tuned")]

    relu = node_rule("relu", aten.relu.default, relu_to_clamp)
    twice = GraphRule("twice", lambda gm, v, c: [*relu.find(gm, v, c), *relu.find(gm, v, set())])
    found = G.discover(G.capture(model, args), args, [twice])
    assert len(found.matches) == 3 and len(found.kept) == 3
    assert all("overlaps" in k.why for k in found.kept)


def test_a_replacement_running_pytorch_instead_of_a_kernel_is_refused():
    """torch.ops.autotune.interaction with no kernel loaded for its shape: PyTorch's code would run: refused."""

    class Dot(nn.Module):
        def forward(self, x: torch.Tensor, ly: torch.Tensor) -> torch.Tensor:
            return Interaction()(x, list(ly.unbind(1)))

    x, ly = torch.randn(6, 10), torch.randn(6, 2, 10)  # (tables 2, dim 10): no test tunes this signature
    gm = G.capture(Dot(), (x, ly))
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]

    def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Any:
        xs, lys = [n for n in gm.graph.nodes if n.op == "placeholder"]

        def replace(gm: Any) -> tuple[Any, ...]:
            with gm.graph.inserting_before(out.next):
                return (gm.graph.call_function(torch.ops.autotune.interaction.default, (xs, lys, False)),)

        yield GraphMatch("dot", (out,), (out,), (), replace, where="", what="dot")

    with warnings.catch_warnings():
        warnings.simplefilter("error", at.NoTunedKernelWarning)
        done = G.rewrite(gm, (x, ly), [GraphRule("dot", find)])
    (kept,) = done.kept
    assert "no loaded interaction kernel" in kept.why and "tables=2 dim=10" in kept.why


def test_rules_run_in_one_order_and_quantizing_ones_only_when_asked():
    """Given rules run in the order given, extra ones after; the built-in ones in rules.ORDER; a name given twice
    or a `fuses` naming no rule of the set is refused when the rules are collected, before any work."""
    from autotune.torch.rules import ORDER, RuleError, collect_rules

    def rule(name: str, quantizes: bool = False, fuses: tuple[str, ...] = ()) -> GraphRule:
        return GraphRule(name, lambda gm, v, c: (), quantizes=quantizes, fuses=fuses)

    rules = [rule("q", True), rule("b"), rule("a")]
    assert [r.name for r in collect_rules(False, rules=rules)] == ["b", "a"]
    assert [r.name for r in collect_rules(True, extra=[rule("z")], rules=rules)] == ["q", "b", "a", "z"]
    names = [r.name for r in collect_rules(True)]  # the templates' own and oneDNN's, in ORDER
    assert names == [n for n in ORDER if n in names] and set(names) == set(ORDER)
    assert names.index("batched_embedding_bag") < names.index("embedding_bag") < names.index("interaction")
    assert "qmatmul" in names and "qmatmul" not in [r.name for r in collect_rules(False)]
    with pytest.raises(RuleError, match="'f' fuses 'bags', which no rule of this set is named"):
        collect_rules(True, rules=[rule("f", fuses=("bags",)), rule("a")])
    with pytest.raises(RuleError, match="'f' fuses 'bags'"):  # refused whether or not it would run
        collect_rules(False, rules=[rule("f", quantizes=True, fuses=("bags",))])
    with pytest.raises(RuleError, match="given twice: a"):
        collect_rules(True, extra=[rule("a")], rules=rules)


def test_a_template_rule_without_a_place_in_the_order_is_refused(monkeypatch):
    from autotune.torch import rules as R
    from search_spaces.interaction import graph as igraph

    monkeypatch.setattr(igraph, "RULES", (*igraph.RULES, GraphRule("interaction_v2", lambda gm, v, c: ())))
    with pytest.raises(R.RuleError, match="interaction_v2 have no place in autotune.torch.rules.ORDER"):
        R.collect_rules(True)


def test_profile_times_each_module_and_new_nodes_keep_their_module(model, tmp_path):
    args = make_batch(model, BATCH)
    gm = G.capture(model, args)
    by_top = profiling.profile(gm, args, runs=2, depth=1)
    assert {"bottom", "embeddings", "interaction", "top"} <= set(by_top) and all(t > 0 for t in by_top.values())
    fine = profiling.profile(gm, args, runs=2)
    assert {"bottom.0", "bottom.1", "embeddings.2", "top.2"} <= set(fine)
    G.rewrite(gm, args, [node_rule("relu", aten.relu.default, relu_to_clamp)])
    assert "bottom.1" in profiling.profile(gm, args, runs=1)  # the clamp_min that replaced bottom.1's relu


def test_a_model_with_nothing_we_serve_comes_back_unchanged(tmp_path):
    m = nn.Sequential(nn.LayerNorm(3), nn.Tanh()).eval()
    opt, report = tune(m, (torch.randn(5, 3),), tmp_path, quantize=True)
    assert opt is m
    assert report.tasks == [] and report.replaced == [] and report.measured == 0
    assert "nothing in this model is served" in str(report)
    assert not (tmp_path / "logs").exists()  # nothing tuned, nothing written


def test_a_runner_that_names_none_is_refused_before_any_work(model, tmp_path):
    with pytest.raises(ValueError, match="unknown runner 'tcp://h:1/k'; expected local, offline:DIR or rpc://"):
        tune(model, make_batch(model, BATCH), tmp_path, runner="tcp://h:1/k")
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("bad", ["dense width", "index out of range"])
def test_example_inputs_that_fail_raise_the_model_own_error(model, tmp_path, bad):
    dense, indices, offsets = make_batch(model, BATCH)
    if bad == "dense width":
        dense = torch.randn(BATCH, 7)
    else:
        indices = [indices[0], indices[1], indices[2] + 1000]
    with pytest.raises(Exception) as eager:
        model(dense, indices, offsets)
    with pytest.raises(type(eager.value)) as ours:
        tune(model, (dense, indices, offsets), tmp_path)
    assert str(ours.value) == str(eager.value) and not isinstance(ours.value, G.CaptureError)


# ---- end to end on the operators' own rules (tunes and compiles kernels) ------------------------------------------
@pytest.fixture(scope="module")
def shared_workers(cpu_builder, local_runner):
    """The session's build pool and measure worker in place of the one of each a tune_model call starts (each a
    fresh process importing TVM, ~5 s apiece on 2 cores): the same classes and settings, candidates timed
    briefly (`conftest.BRIEF`). Yields how many tune_model asked for."""
    from conftest import BRIEF, default_pools

    with default_pools(cpu_builder, local_runner, timing=BRIEF) as asked:
        yield asked


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory, shared_workers):
    torch.manual_seed(0)
    m = TinyDLRM().eval()
    args = make_batch(m, BATCH)
    log_dir = tmp_path_factory.mktemp("tune_model_fp32")
    before = dict(shared_workers)
    opt, report = at.tune_model(m, args, log_dir=log_dir, trials=2, quantize=False, progress=False,
                                bench_rounds=1, bench_seconds=0.05, require_speedup=False)  # tiny: may lose
    # every task and the export share one build pool and one measure worker
    assert {k: shared_workers[k] - before[k] for k in before} == {"builders": 1, "runners": 1}
    return m, args, opt, report, log_dir


@pytest.mark.slow
def test_tiny_dlrm_end_to_end_fp32(fp32_run):
    m, args, opt, report, log_dir = fp32_run
    # the fused kernel and the two it fuses are all tuned (tune_model would time the model with each way; the
    # test's require_speedup=False wires in the fused one, which agrees)
    assert {t.op for t in report.tasks} == {"embedding_interaction", "batched_embedding_bag", "interaction"}
    assert all(t.share > 0 and t.best_s and t.measured + t.resumed >= 2 for t in report.tasks)
    assert report.measured == sum(t.measured for t in report.tasks) >= 2
    assert {r.rule for r in report.replaced} == {"embedding_interaction", "dense_linear"}, str(report)
    ops = _graph_ops(opt)
    assert torch.ops.autotune.embedding_interaction.default in ops
    assert not any(str(t).startswith("aten.embedding_bag") or t in (aten.bmm.default, aten.linear.default)
                   for t in ops)
    assert report.max_abs_diff < 1e-4 and report.speedup is not None
    assert (log_dir / "package" / "manifest.json").exists() and report.exported
    other = make_batch(m, 13, seed=1)
    with torch.inference_mode():
        torch.testing.assert_close(opt(*other), m(*other), rtol=1e-4, atol=1e-4)
        compiled = torch.compile(opt, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(*other), m(*other), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_second_call_with_the_same_logs_tunes_nothing(fp32_run, shared_workers):
    m, args, opt, report, log_dir = fp32_run
    manifest = (log_dir / "package" / "manifest.json").stat().st_mtime_ns
    before = dict(shared_workers)
    opt2, again = at.tune_model(m, args, log_dir=log_dir, trials=2, quantize=False, progress=False, bench_rounds=0,
                                require_speedup=False)
    assert again.measured == 0 and all(t.resumed >= 2 for t in again.tasks)
    assert shared_workers == before  # nothing to tune or export: no pool nor worker started
    assert not again.exported and (log_dir / "package" / "manifest.json").stat().st_mtime_ns == manifest
    assert [r.rule for r in again.replaced] == [r.rule for r in report.replaced]
    with torch.inference_mode():
        torch.testing.assert_close(opt2(*args), m(*args), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_tiny_dlrm_int8(model, tmp_path, shared_workers):
    """The int8 rule alone (the fp32 test covers the others): the bottom MLP's narrow head runs weight-only and
    quantizes its output for the next layer in one kernel (qmatmul_requant), whose qmatmul outputs float32."""
    import search_spaces

    args = make_batch(model, BATCH)
    opt, report = at.tune_model(model, args, log_dir=tmp_path / "logs", trials=2, quantize=True, progress=False,
                                bench_rounds=0, rules=search_spaces.get("qmatmul").graph_rules(),
                                require_speedup=False)  # batch 8: int8 need not win, its wiring is tested
    assert {t.op for t in report.tasks} == {"qmatmul", "qmatmul_requant"}, str(report)
    assert [r.where for r in report.replaced] == ["bottom.0, bottom.1, bottom.2, bottom.3"], str(report)
    ops = _graph_ops(opt)
    assert torch.ops.autotune.qmatmul_requant.default in ops and torch.ops.autotune.qmatmul.default in ops
    assert 0 < report.max_abs_diff < 1e-2  # int8: not exact, but close on the probabilities
    other = make_batch(model, 13, seed=1)
    with torch.inference_mode():
        torch.testing.assert_close(opt(*other), model(*other), rtol=0, atol=1e-2)


class Outlier(nn.Module):
    """Linear(64, 32) + ReLU -> Linear(32, 16) whose first input feature is 3000x the others and its weights
    3000x smaller: the model's outputs are ordinary, but one scale per row leaves the first layer's int8
    activations nothing of the other features (LLM.int8()'s outlier problem); the second layer's input is
    ordinary."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))
        with torch.no_grad():
            self.a[0].weight[:, 0] /= 3000

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x)

    @staticmethod
    def batch(seed: int) -> torch.Tensor:
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(seed))
        x[:, 0] *= 3000
        return x


def _tuned_outlier(tmp_path: Any) -> tuple[nn.Module, Any, Any, dict[str, Any]]:
    """Outlier through tune_model's int8 rule alone: (model, rewritten model, report, its layers by module)."""
    import search_spaces

    torch.manual_seed(0)
    model = Outlier().eval()
    opt, report = at.tune_model(model, Outlier.batch(0), log_dir=tmp_path / "logs", trials=2, progress=False,
                                bench_rounds=0, rules=search_spaces.get("qmatmul").graph_rules(),
                                require_speedup=False)
    return model, opt, report, {layer.where: layer for layer in report.accuracy.layers}


@pytest.mark.slow
def test_int8_layers_that_break_the_tolerance_come_back_fp32_and_the_report_says_so(tmp_path, shared_workers,
                                                                                      monkeypatch):
    """The first layer alone in int8 breaks the default tolerance about 70 times over, the second uses half of
    it: the chain is split before anything is tuned, the first layer stays PyTorch's, the second runs int8
    alone (its input quantized by quantize_rows), and the report lists both with the measured error. Smoothing
    is off: it would rescue this outlier column (test_graph_rules pins that); this test pins the fallback."""
    import search_spaces.qmatmul.graph as qgraph

    monkeypatch.setattr(qgraph, "SMOOTH_GAIN", 0.0)
    model, opt, report, layers = _tuned_outlier(tmp_path)
    assert set(layers) == {"a.0, a.1", "a.2"}, str(report)
    assert layers["a.0, a.1"].precision == "fp32" and layers["a.0, a.1"].share > 10
    assert layers["a.0, a.1"].why == "kept in fp32 to hold the tolerance"
    assert layers["a.2"].precision == "int8" and layers["a.2"].share < 1
    assert {t.op for t in report.tasks} == {"quantize_rows", "qmatmul"}  # the second layer's, alone
    assert report.accuracy.holds and [r.where for r in report.replaced] == ["a.2"], str(report)
    text = str(report)
    assert "reduced-precision layers: 1 int8, 1 fp32" in text and "held-out (drawn like the example)" in text
    ops = _graph_ops(opt)
    assert ops.count(aten.linear.default) == 1 and torch.ops.autotune.qmatmul.default in ops
    with torch.inference_mode():
        x = Outlier.batch(5)
        assert 0 < float((opt(x) - model(x)).abs().max()) <= 1e-2


@pytest.mark.slow
def test_smoothing_keeps_a_layer_with_an_outlier_column_int8(tmp_path, shared_workers):
    """The same model as it ships: the outlier column is divided down and its weight column multiplied up
    (SmoothQuant), so the first layer holds the tolerance in int8 and the whole chain runs int8."""
    model, opt, report, layers = _tuned_outlier(tmp_path)
    assert [layers[w].precision for w in ("a.0, a.1", "a.2")] == ["int8", "int8"], str(report)
    assert layers["a.0, a.1"].what.endswith("smoothed)") and layers["a.0, a.1"].share < 1, str(report)
    assert report.accuracy.holds and torch.ops.autotune.qmatmul_requant.default in _graph_ops(opt)
    with torch.inference_mode():  # a batch the contract never saw: near its bound (1.06e-2), not 70x over it
        x = Outlier.batch(5)
        assert 0 < float((opt(x) - model(x)).abs().max()) <= 2e-2


class FourTables(nn.Module):
    """Four one-hot-to-3-hot tables side by side: two of ordinary range (int8 rows off by about 1e-2 per
    element) and two a thousand times smaller (off by 1e-5)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embs = nn.ModuleList(nn.EmbeddingBag(40, 8, mode="sum") for _ in range(4))
        with torch.no_grad():
            for emb in self.embs[2:]:
                emb.weight *= 1e-3

    def forward(self, i0: torch.Tensor, o0: torch.Tensor, i1: torch.Tensor, o1: torch.Tensor, i2: torch.Tensor,
                o2: torch.Tensor, i3: torch.Tensor, o3: torch.Tensor) -> torch.Tensor:
        return torch.cat([emb(i, o) for emb, i, o in zip(self.embs, (i0, i1, i2, i3), (o0, o1, o2, o3))], 1)

    @staticmethod
    def batch(seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        out: list[torch.Tensor] = []
        for _ in range(4):
            sizes = torch.randint(1, 4, (BATCH,), generator=g)
            out += [torch.randint(0, 40, (int(sizes.sum()),), generator=g),
                    torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)[:-1]])]
        return tuple(out)


@pytest.mark.slow
def test_int8_tables_that_break_the_tolerance_come_back_fp32_and_the_report_says_so(tmp_path, shared_workers):
    """Under a 1e-3 contract the ordinary tables cannot be int8 rows, the small ones can: two batched launches,
    one over int8 rows and one over fp32 rows, and the report says which table is which and why."""
    import search_spaces

    model = FourTables().eval()
    opt, report = at.tune_model(model, FourTables.batch(0), log_dir=tmp_path / "logs", trials=2, progress=False,
                                bench_rounds=0, rules=search_spaces.get("batched_embedding_bag").graph_rules(),
                                tolerance=at.Tolerance(atol=1e-3), require_speedup=False)
    layers = [(layer.what, layer.precision, layer.why) for layer in report.accuracy.layers]
    kept = "kept in fp32 to hold the tolerance"
    assert layers == [("EmbeddingBag(40, 8) table, int8 rows", "fp32", kept)] * 2 + \
                     [("EmbeddingBag(40, 8) table, int8 rows", "int8", "")] * 2, str(report)
    assert sorted(r.rule for r in report.replaced) == ["batched_embedding_bag", "batched_embedding_bag_int8"]
    assert sorted(t.fields.get("dtype", "float32") for t in report.tasks) == ["float32", "int8"]
    calls = [n for n in opt.graph.nodes if n.target is torch.ops.autotune.batched_embedding_bag.default]
    assert sorted(str(getattr(opt, n.args[0].target).dtype) for n in calls) == ["torch.float32", "torch.uint8"]
    assert report.accuracy.holds
    with torch.inference_mode():
        other = FourTables.batch(5)
        assert 0 < float((opt(*other) - model(*other)).abs().max()) <= 1e-3


def test_a_site_whose_task_found_no_kernel_is_kept_with_the_reason():
    from autotune.torch.session import TuningSession, task_key
    from autotune.torch.tune_model import TaskReport

    fields = dict(batch=BATCH, tables=3, dim=16)
    session = TuningSession("cpu", "unused", trials=2)
    failed = TaskReport(key=task_key("interaction", fields, session.device.name), fields=fields,
                        why="tuning found no correct kernel in 2 trials (see interaction.jsonl)")
    session.tasks.append(failed)
    ready = session.ready()

    def site(f: dict[str, Any]) -> GraphMatch:
        return GraphMatch("interaction", (), (), (("interaction", f),), lambda gm: ())

    assert ready(site(fields)) == "missing kernel: interaction: tuning found no correct kernel in 2 trials " \
                                  "(see interaction.jsonl)"
    assert "was not tuned" in ready(site(dict(fields, dim=8)))
    failed.record = object()  # a best record: the site may be tried
    assert ready(site(fields)) is None


def test_a_layer_left_in_fp32_says_why_each_reduced_precision_rule_left_it():
    """int8 may refuse a layer by its shape and bf16 then lose its speed check: the report names both, so it
    does not read as if int8's refusal alone kept the layer in fp32."""
    from autotune.torch.ladder import why_kept
    from search_spaces.template import Reduced

    layer = Reduced("linear_2", "top.2", "Linear(256, 1)", simulate=lambda *a: None)
    kept = [Kept("qmatmul_int8", "top.2", "out_features 1 < 8: too few outputs for int8 to pay off"),
            Kept("interaction", "top.2", "not an interaction"),  # a rule that reduces nothing
            Kept("dense_linear_bf16", "top.2", "slower: 0.05 ms vs PyTorch 0.04 ms", slower=True),
            Kept("dense_linear_bf16", "top.0", "slower: 0.2 ms vs PyTorch 0.1 ms", slower=True)]
    why = why_kept(layer, kept, {"qmatmul_int8", "dense_linear_bf16"})
    assert why == ("qmatmul_int8: out_features 1 < 8: too few outputs for int8 to pay off; "
                   "dense_linear_bf16: slower: 0.05 ms vs PyTorch 0.04 ms")
    assert why_kept(layer, kept[1:2], {"qmatmul_int8"}) == "its site was not rewritten"


def test_tasks_measure_the_best_config_a_sibling_found_after_them(tmp_path):
    """Tasks are tuned as the rewrites need them, so one tuned early never saw what a sibling found later: each
    then measures the siblings' best configs it lacks (once, a sibling being just tuned), and keeps the faster
    after measuring the winner and its old best again. A round that tuned nothing shares nothing."""
    import random

    from autotune import records
    from autotune.build import Built
    from autotune.measure import Measured
    from autotune.task import make_task
    from autotune.torch.session import TuningSession
    from autotune.torch.tune_model import TaskReport

    shapes = [dict(rows=400, dim=16, batch=32, pooling=(0, 12)), dict(rows=500, dim=16, batch=32, pooling=(0, 12))]
    early, late = (make_task("embedding_bag", "cpu", **f) for f in shapes)
    cfgs = list(dict.fromkeys(early.space.sample(random.Random(i)) for i in range(8)))
    mine, found = cfgs[0], cfgs[1]  # each task's own best; `found` runs `early` twice as fast as `mine`
    speed = {(early.workload_key, found.key()): 1e-4, (early.workload_key, mine.key()): 2e-4,
             (late.workload_key, mine.key()): 5e-4}
    records.append(tmp_path / "embedding_bag.jsonl",
                   [early.record(mine, costs=(2e-4,)), early.record(cfgs[2], costs=(3e-4,)),
                    late.record(found, costs=(1e-4,))])
    measured: list[tuple[str, str]] = []

    class Pools:  # the build pool and measure worker, faked: each config's time is `speed`'s
        def builder(self):
            return self

        def runner(self):
            return self

        def build(self, task, configs):
            return [Built(c, None, 0.0) for c in configs]

        def measure(self, task, built):
            measured.extend((task.workload_key, b.config.key()) for b in built)
            return [Measured(b, (speed[task.workload_key, b.config.key()],)) for b in built]

    pools = Pools()
    session = TuningSession("cpu", tmp_path, trials=2, shipped=False, progress=False, runner=pools, builder=pools)
    reports = session.tasks
    for task, f, n in ((early, shapes[0], 2), (late, shapes[1], 1)):
        t = TaskReport(key=task.key, fields=f, measured=n)
        t.record = session.logs.own("embedding_bag").best(task)
        t.best_s = t.record.latency
        reports.append(t)
    session._share_bests(reports[1:])
    # `early` measured `found` (faster: then both again), `late` measured `mine` (slower: once)
    assert sorted(measured) == sorted([(early.workload_key, found.key()), (early.workload_key, found.key()),
                                       (early.workload_key, mine.key()), (late.workload_key, mine.key())])
    assert reports[0].record.config_key == found.key() and reports[0].best_s == pytest.approx(1e-4)
    assert reports[1].record.config_key == found.key() and reports[1].measured == 1 + 1
    measured.clear()
    session._share_bests(reports[1:])  # nothing new to measure
    for t in reports:
        t.measured = 0
    session._share_bests(reports)  # nothing tuned this round
    assert measured == []


# ---- the session: budget, scheduler, shipped records -------------------------------------------------------------
class FakePools:
    """A build pool and measure worker, faked: each config of a workload takes `speed(workload_key, config)`;
    `calls` lists each measure call's (workload key, configs)."""

    def __init__(self, speed: Callable[[str, Any], float]):
        self.speed, self.calls = speed, []

    def build(self, task: Any, configs: Any) -> Any:
        from autotune.build import Built

        return [Built(c, None, 0.0) for c in configs]

    def measure(self, task: Any, built: Any) -> Any:
        from autotune.measure import Measured

        self.calls.append((task.workload_key, len(built)))
        return [Measured(b, (self.speed(task.workload_key, b.config),)) for b in built]

    def close(self) -> None:
        pass


BAG_SHAPES = [dict(rows=400, dim=16, batch=32, pooling=(0, 12)), dict(rows=500, dim=16, batch=32, pooling=(0, 12))]


def test_promise_is_the_last_batch_gain_or_a_prior_that_shrinks():
    from autotune.torch.session import PRIOR, promise

    assert promise([1.0]) == PRIOR
    assert promise([1.0, 0.5]) == 0.5  # the last batch halved the time
    assert promise([1.0, 1.0]) == PRIOR / 2 and promise([1.0, 1.0, 1.0, 1.0]) == PRIOR / 4


def test_a_budget_gives_the_next_batch_to_the_task_that_promises_the_model_most(tmp_path):
    """Each task gets a first batch; then the task with 90% of the model's time gets the next batch before the
    one with 10% (same promise, similar cost); `trials` caps both, and the scheduler stops when none has more."""
    import zlib

    from autotune.task import make_task
    from autotune.torch.report import TaskReport
    from autotune.torch.session import BATCH, TuningSession

    pools = FakePools(lambda w, cfg: 1e-4 * (1 + zlib.crc32(cfg.key().encode()) % 100))
    session = TuningSession("cpu", tmp_path, trials=2 * BATCH, shipped=False, progress=False, runner=pools,
                            builder=pools, budget=600)
    tasks = [make_task("embedding_bag", "cpu", **f) for f in BAG_SHAPES]
    light, heavy = (TaskReport(key=t.key, fields=f, share=s) for t, f, s in zip(tasks, BAG_SHAPES, (0.1, 0.9)))
    session.tasks += [light, heavy]
    for t in (light, heavy):  # as `tune` does first
        session._tune_task(t, BATCH)
    session._schedule()
    runs: list[list[Any]] = []  # one task's measure calls in a row, its batch's 1-config confirm left out
    for w, n in pools.calls:
        if n == 1:
            continue
        if runs and runs[-1][0] == w and runs[-1][1] < BATCH:
            runs[-1][1] += n
        else:
            runs.append([w, n])
    assert [w for w, _ in runs] == [light.key.workload_key, heavy.key.workload_key, heavy.key.workload_key,
                                    light.key.workload_key], pools.calls
    assert all(n == BATCH for _, n in runs)
    for t in (light, heavy):
        assert t.measured == 2 * BATCH and t.batches == 2 and t.tuning_s > 0 and t.best_s <= t.first_s
    # a second call over the same logs resumes: each log holds its first batch, so nothing is tuned
    again = TuningSession("cpu", tmp_path, trials=2 * BATCH, shipped=False, progress=False, runner=pools,
                          builder=pools, budget=600)
    resumed = [TaskReport(key=t.key, fields=f, share=s) for t, f, s in zip(tasks, BAG_SHAPES, (0.1, 0.9))]
    again.tasks += resumed
    calls = len(pools.calls)
    for t in resumed:
        again._tune_task(t, BATCH)
    again._schedule()
    assert len(pools.calls) == calls and all(t.measured == 0 and t.resumed == 2 * BATCH for t in resumed)
    with pytest.raises(ValueError, match="budget must be a number of seconds > 0, got '60'"):
        TuningSession("cpu", tmp_path, trials=8, budget="60")


def test_a_task_under_one_percent_of_the_model_gets_the_cost_models_two_best_guesses(tmp_path, monkeypatch):
    """Without a budget each task gets `trials` configs, except one under SMALL_SHARE of the model's time: it
    gets SMALL_TRIALS (a small table the contract split off a batched launch is not worth a batch of its own).
    Under a budget, each task's first batch is FIRST configs."""
    import zlib

    from autotune.task import make_task
    from autotune.torch.report import TaskReport
    from autotune.torch.session import FIRST, SMALL_SHARE, SMALL_TRIALS, TuningSession

    pools = FakePools(lambda w, cfg: 1e-4 * (1 + zlib.crc32(cfg.key().encode()) % 100))
    session = TuningSession("cpu", tmp_path, trials=4, shipped=False, progress=False, runner=pools, builder=pools)
    monkeypatch.setattr(session, "_share_bests", lambda new: None)
    monkeypatch.setattr(session, "_package", lambda best, out: (out, False))
    tasks = [make_task("embedding_bag", "cpu", **f) for f in BAG_SHAPES]
    small, large = (TaskReport(key=t.key, fields=f, share=s)
                    for t, f, s in zip(tasks, BAG_SHAPES, (SMALL_SHARE / 2, 0.5)))
    session.tasks += [small, large]
    session.tune([large, small])
    assert (small.measured, large.measured) == (SMALL_TRIALS, 4)
    # under a budget a task's first batch is FIRST configs (then the scheduler's, here none), a small one's fewer
    budgeted = TuningSession("cpu", tmp_path / "budget", trials=3 * FIRST, shipped=False, progress=False,
                             runner=pools, builder=pools, budget=600)
    monkeypatch.setattr(budgeted, "_share_bests", lambda new: None)
    monkeypatch.setattr(budgeted, "_package", lambda best, out: (out, False))
    monkeypatch.setattr(budgeted, "_schedule", lambda: None)
    small, large = (TaskReport(key=t.key, fields=f, share=s)
                    for t, f, s in zip(tasks, BAG_SHAPES, (SMALL_SHARE / 2, 0.5)))
    budgeted.tasks += [small, large]
    budgeted.tune([large, small])
    assert (small.measured, large.measured) == (SMALL_TRIALS, FIRST)


def test_a_task_the_shipped_records_cover_is_not_tuned_unless_asked(tmp_path, monkeypatch):
    from autotune import records
    from autotune.task import make_task
    from autotune.torch.session import TuningSession

    task = make_task("embedding_bag", "cpu", **BAG_SHAPES[0])
    shipped = tmp_path / "shipped" / "embedding_bag.jsonl"
    cfg = task.space.default()
    records.append(shipped, [task.record(cfg, costs=(1e-5,))])
    monkeypatch.setattr(records, "shipped_logs", lambda op, device: [shipped] if op == "embedding_bag" else [])
    for retune, want in ((False, 0), (True, 2)):
        pools = FakePools(lambda w, c: 2e-5)
        session = TuningSession("cpu", tmp_path / f"own{retune}", trials=2, progress=False, runner=pools,
                                builder=pools, retune=retune)
        (t,) = session.add([GraphMatch("bag", (), (), (("embedding_bag", BAG_SHAPES[0]),), lambda gm: ())], {})
        session._tune_task(t, 2)
        assert t.measured == want and (t.shipped == 1) != retune, t
        assert t.source == "shipped record" and t.best_s == pytest.approx(1e-5)  # the faster one, either way
        assert ("covered by 1 shipped records" in t.describe()) != retune
