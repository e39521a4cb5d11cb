"""tune_model's accuracy contract (autotune/torch/accuracy.py), with quantizing rules of the test's own: no
tuning, no TVM. A rule "quantizes" a Linear by adding a fixed error to its output, and says so in its `Reduced`
simulation; the contract must move the layers that break the tolerance to fp32 one at a time
(`accuracy.next_to_fall_back`), and say so in the report. The operators' own int8 rule under the contract:
tests/test_tune_model.py (slow).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import autotune.torch as at
from autotune.torch import accuracy as A
from autotune.torch import graph as G
from search_spaces.template import GraphMatch, GraphRule, Reduced

aten = torch.ops.aten


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)).eval()


def batch(seed: int = 0, rows: int = 32) -> tuple[torch.Tensor]:
    return (torch.randn(rows, 8, generator=torch.Generator().manual_seed(seed)),)


def _offset(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *, error: float) -> torch.Tensor:
    return aten.linear.default(x, w, b) + error


def noisy_rule(errors: dict[str, float], simulated: dict[str, float] | None = None, precision: str = "int8",
               name: str = "") -> GraphRule:
    """A quantizing rule of `precision` (named `name`, else after it): each Linear at a module path in `errors`
    becomes linear + that error; its simulation adds `simulated`'s error instead where given (a simulation that
    misjudges the layer)."""
    simulated = errors if simulated is None else simulated
    name, tag = (name or "noisy", "noisy") if precision == "int8" else (name or f"noisy_{precision}",
                                                                         f"noisy {precision}")

    def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Any:
        for n in list(gm.graph.nodes):
            path = G.module_path(n)
            if n.op != "call_function" or n.target is not aten.linear.default or n in claimed or path not in errors:
                continue

            def replace(gm: Any, n: Any = n, e: float = errors[path]) -> tuple[Any, ...]:
                with gm.graph.inserting_before(n.next):
                    return (gm.graph.call_function(_offset, n.args, {"error": e}),)

            sim = simulated[path]
            yield GraphMatch(name, (n,), (n,), (), replace, tolerance=(0.0, 1.0), where=path, what=f"{tag} {path}",
                             reduced=(Reduced(n.name, path, f"Linear at {path}, {tag}",
                                              lambda *a, e=sim, **k: _offset(*a, **k, error=e), precision),))

    return GraphRule(name, find, quantizes=True, precision=precision)


def tune(model: nn.Module, args: Any, tmp_path: Any, **kw: Any) -> tuple[Any, Any]:
    kw.setdefault("require_speedup", False)
    return at.tune_model(model, args, log_dir=tmp_path / "logs", progress=False, bench_rounds=0, **kw)


def precisions(report: Any) -> dict[str, str]:
    return {layer.where: layer.precision for layer in report.accuracy.layers}


# ---- the contract ---------------------------------------------------------------------------------------------
def test_layers_that_break_the_tolerance_stay_fp32_the_most_sensitive_first(tmp_path):
    model, args = mlp(), batch()
    rule = noisy_rule({"0": 1e-3, "2": 3e-3, "4": 5e-2})  # the last layer's error reaches the output as it is
    opt, report = tune(model, args, tmp_path, rules=[rule], tolerance=1e-2)
    assert precisions(report) == {"0": "int8", "2": "int8", "4": "fp32"}, str(report)
    shares = {layer.where: layer.share for layer in report.accuracy.layers}
    assert shares["4"] == pytest.approx(5.0, rel=1e-3) and shares["4"] > shares["2"] > 0 and shares["0"] > 0
    assert report.accuracy.holds and len(report.accuracy.errors) == 2  # the example and one drawn like it
    assert all(0 < e.error <= 1e-2 and e.allowed == 1e-2 for e in report.accuracy.errors)
    text = str(report)
    assert "accuracy: |optimized - eager| <= 0.01 per output, holds on 2 batch(es)" in text
    assert "held-out (drawn like the example): max |optimized - eager|" in text
    assert "4 Linear at 4, noisy: fp32 (5x the allowed error alone in reduced precision; kept in fp32 to hold the " \
           "tolerance)" in text
    assert "reduced-precision layers: 2 int8, 1 fp32" in text
    with torch.inference_mode():
        err = float((opt(*batch(7)) - model(*batch(7))).abs().max())
    assert 0 < err <= 1e-2
    # a looser contract keeps every layer in int8; the default (1e-2 on outputs of this size) does what 1e-2 did
    _, loose = tune(model, args, tmp_path, rules=[rule], tolerance=at.Tolerance(atol=0.1))
    assert set(precisions(loose).values()) == {"int8"}
    _, default = tune(model, args, tmp_path, rules=[rule])
    assert precisions(default) == precisions(report)


def test_layers_climb_the_precision_ladder_one_step_at_a_time(tmp_path):
    """int8 breaks the contract at "2" and "4"; bf16 holds it at "2" (its error 2e-3 where int8's is 5e-2) but not
    at "4", the last layer, whose error reaches the output as it is: "0" stays int8, "2" runs bf16, "4" fp32."""
    model, args = mlp(), batch()
    int8 = noisy_rule({"0": 1e-3, "2": 5e-2, "4": 5e-2})
    bf16 = noisy_rule({"0": 1e-4, "2": 2e-3, "4": 3e-2}, precision="bf16")
    _, report = tune(model, args, tmp_path, rules=[int8, bf16], tolerance=1e-2)
    assert precisions(report) == {"0": "int8", "2": "bf16", "4": "fp32"}, str(report)
    why = {layer.where: layer.why for layer in report.accuracy.layers}
    assert why == {"0": "", "2": "in bf16 to hold the tolerance", "4": "kept in fp32 to hold the tolerance"}
    assert report.accuracy.holds and "reduced-precision layers: 1 int8, 1 bf16, 1 fp32" in str(report)
    assert sorted(r.rule for r in report.replaced) == ["noisy", "noisy_bf16"]
    # without a bf16 rung, the same contract keeps both in fp32
    _, plain = tune(model, args, tmp_path, rules=[int8], tolerance=1e-2)
    assert precisions(plain) == {"0": "int8", "2": "fp32", "4": "fp32"}, str(plain)
    assert "reduced-precision layers: 1 int8, 2 fp32" in str(plain)


def test_int8_layers_move_up_a_rung_where_the_finer_rung_runs_the_model_faster(tmp_path, monkeypatch):
    """Both rungs hold the contract; where the model runs faster with the int8 layers in bf16 (bf16 GEMMs on AMX
    tiles against int8 on VNNI), they move up, the report saying why; where it does not, they stay int8."""
    from autotune.torch import speed

    model, args = mlp(), batch()
    int8 = noisy_rule({"0": 1e-4, "2": 1e-4, "4": 1e-4})
    bf16 = noisy_rule({"0": 1e-5, "2": 1e-5}, precision="bf16")  # no bf16 rung for "4"

    def whole_models(int8_s: float, bf16_s: float, wholes: list[Any]) -> Any:
        def time_pair(old: Any, new: Any, c: Any) -> tuple[float, float]:
            o, n = old(), new()
            if isinstance(o, tuple):  # a match's subgraph: each replacement beats the fp32 code alone
                return 2e-3, 1e-3
            if old.model is model:  # the model as given, against the one tune_model returns: slower
                return 20e-3, 5e-3
            wholes.append((o, n))
            return int8_s, bf16_s

        return time_pair

    check = at.SpeedCheck(rounds=1, seconds=0.001)
    wholes: list[Any] = []
    monkeypatch.setattr(speed, "time_pair", whole_models(10e-3, 6e-3, wholes))
    _, report = tune(model, args, tmp_path, rules=[int8, bf16], tolerance=1e-2, require_speedup=True, speed=check)
    assert precisions(report) == {"0": "bf16", "2": "bf16", "4": "fp32"}, str(report)
    assert len(wholes) == 1 and report.accuracy.holds
    why = {layer.where: layer.why for layer in report.accuracy.layers}
    assert why["0"] == why["2"] == "in bf16: faster than int8 here"
    assert "noisy's int8 layers one rung up: the model takes 6 ms with them, 10 ms in int8: moved up" in str(report)

    monkeypatch.setattr(speed, "time_pair", whole_models(6e-3, 10e-3, []))
    _, report = tune(model, args, tmp_path, rules=[int8, bf16], tolerance=1e-2, require_speedup=True, speed=check)
    assert precisions(report) == {"0": "int8", "2": "int8", "4": "int8"}, str(report)
    assert "the model takes 10 ms with them, 6 ms in int8: left in int8" in str(report)

    # two int8 rules, judged one after the other: the first's layers stay, the second's move up (its rewrite's
    # own verdicts replace the first model's, not the first rule's line)
    first, second = noisy_rule({"0": 1e-4}, name="noisy_a"), noisy_rule({"2": 1e-4}, name="noisy_b")
    answers = iter([(6e-3, 9e-3), (10e-3, 6e-3), (20e-3, 5e-3)])  # the last: the model as given, against it
    monkeypatch.setattr(speed, "time_pair", lambda old, new, c: (2e-3, 1e-3) if isinstance(old(), tuple)
                        else next(answers))
    _, report = tune(model, args, tmp_path, rules=[first, second, bf16], tolerance=1e-2, require_speedup=True,
                     speed=check)
    assert precisions(report) == {"0": "int8", "2": "bf16"}, str(report)
    assert "noisy_a's int8 layers one rung up: the model takes 9 ms with them, 6 ms in int8: left in int8" in \
        str(report)
    assert "noisy_b's int8 layers one rung up: the model takes 6 ms with them, 10 ms in int8: moved up" in str(report)


def test_an_int8_layer_feeding_a_bf16_one_moves_up_alone_where_the_model_runs_faster(tmp_path, monkeypatch):
    """The contract moves "2" to bf16; the rule's int8 layers ("0" and "4") one rung up do not pay, but "0" alone,
    which feeds "2" (two bf16 layers chain without a float32 activation between them), does: it moves up, and
    "4" stays int8."""
    from autotune.torch import speed

    model, args = mlp(), batch()
    int8 = noisy_rule({"0": 1e-4, "2": 5e-2, "4": 1e-4})
    bf16 = noisy_rule({"0": 1e-5, "2": 1e-5, "4": 1e-5}, precision="bf16")
    # (as it stands, moved up): the rule's layers, then "0"; then the model as given against the result
    answers = iter([(6e-3, 9e-3), (10e-3, 6e-3), (20e-3, 5e-3)])
    monkeypatch.setattr(speed, "time_pair", lambda old, new, c: (2e-3, 1e-3) if isinstance(old(), tuple)
                        else next(answers))
    check = at.SpeedCheck(rounds=1, seconds=0.001)
    _, report = tune(model, args, tmp_path, rules=[int8, bf16], tolerance=1e-2, require_speedup=True, speed=check)
    assert precisions(report) == {"0": "bf16", "2": "bf16", "4": "int8"}, str(report)
    text = str(report)
    assert "noisy's int8 layers one rung up: the model takes 9 ms with them, 6 ms in int8: left in int8" in text
    assert "the int8 layer 0 (it feeds a bf16 layer) one rung up: the model takes 6 ms with them, 10 ms in " \
           "int8: moved up" in text


def test_a_layer_the_simulation_misjudges_is_still_caught_on_the_rewritten_model(tmp_path):
    """The simulation calls every layer harmless; the real replacement of "2" is not: the rewritten model breaks
    the tolerance, so layers go fp32 in fallback order until it holds."""
    model, args = mlp(), batch()
    rule = noisy_rule({"0": 0.0, "2": 0.5, "4": 1e-4}, simulated={"0": 0.0, "2": 1e-4, "4": 2e-4})
    _, report = tune(model, args, tmp_path, rules=[rule], tolerance=1e-2)
    # in the simulation's order: "4" (the most sensitive there), then "2", after which the model holds
    assert precisions(report) == {"0": "int8", "2": "fp32", "4": "fp32"}, str(report)
    assert report.accuracy.holds


def test_the_ladders_steps_are_drafts_and_only_the_model_that_holds_is_judged_whole(tmp_path, monkeypatch):
    """With speed checks, the steps towards the contract are rewritten without the whole-model and fusion checks
    (each replacement still timed); the first draft that holds is rewritten again, judged, and returned; the
    finer rungs' tries replay its verdicts."""
    from autotune.torch import speed
    from autotune.torch.whole_model import Rewriter

    kinds: list[str] = []
    rewritten = Rewriter.rewritten

    def spy(self: Any, floors: dict[str, str], judged: bool = True, replay: Any = None) -> Any:
        kinds.append("replay" if replay is not None else "judged" if judged else "draft")
        return rewritten(self, floors, judged, replay)

    monkeypatch.setattr(Rewriter, "rewritten", spy)
    # each replacement beats its fp32 code; a whole model runs slower with int8 layers moved up
    monkeypatch.setattr(speed, "time_pair", lambda old, new, c: (2e-3, 1e-3) if isinstance(old(), tuple)
                        else (1e-3, 2e-3))
    model, args = mlp(), batch()
    rule = noisy_rule({"0": 0.0, "2": 0.5, "4": 1e-4}, simulated={"0": 0.0, "2": 1e-4, "4": 2e-4})
    _, report = tune(model, args, tmp_path, rules=[rule], tolerance=1e-2, require_speedup=True,
                     speed=at.SpeedCheck(rounds=1, seconds=0.001))
    assert precisions(report) == {"0": "int8", "2": "fp32", "4": "fp32"}, str(report)
    # three drafts, the one that holds judged, then finer_if_faster's two tries (the rule's layers, then "0"
    # alone, which feeds "2")
    assert kinds == ["draft"] * 3 + ["judged"] + ["replay"] * 2 and report.accuracy.holds, kinds
    kinds.clear()  # without speed checks there is nothing to judge: each step is the model
    tune(model, args, tmp_path, rules=[rule], tolerance=1e-2)
    assert kinds == ["judged"] * 3


def test_the_finer_rungs_tries_replay_the_judged_models_fusion_verdict(tmp_path, monkeypatch):
    """The judged model left a fusing rule out (the model ran faster with its parts apart): the tries of a finer
    rung are rewritten with it left out too, and no whole model but the tries' is timed again."""
    import dataclasses

    from autotune.torch import speed
    from autotune.torch.whole_model import Rewriter

    replays: list[set[str]] = []
    rewritten = Rewriter.rewritten

    def spy(self: Any, floors: dict[str, str], judged: bool = True, replay: Any = None) -> Any:
        out = rewritten(self, floors, judged, replay)
        if replay is not None:
            replays.append({r.rule for r in out[1].replaced})
        return out

    wholes: list[tuple[float, float]] = []

    def time_pair(old: Any, new: Any, c: Any) -> tuple[float, float]:
        if isinstance(old(), tuple):  # a match's subgraph: each replacement beats the fp32 code alone
            return 2e-3, 1e-3
        if old.model is model:  # the model as given, against the one tune_model returns: slower
            return 20e-3, 5e-3
        wholes.append((10e-3, 7e-3) if not wholes else (1e-3, 2e-3))  # apart wins; then no rung pays
        return wholes[-1]

    monkeypatch.setattr(Rewriter, "rewritten", spy)
    monkeypatch.setattr(speed, "time_pair", time_pair)
    model, args = mlp(), batch()
    apart = noisy_rule({"0": 1e-4, "2": 1e-4, "4": 1e-4}, name="apart")
    fused = dataclasses.replace(noisy_rule({"0": 1e-4, "2": 1e-4, "4": 1e-4}, name="fused"), fuses=("apart",))
    bf16 = noisy_rule({"0": 1e-5, "2": 1e-5, "4": 1e-5}, precision="bf16")
    _, report = tune(model, args, tmp_path, rules=[fused, apart, bf16], tolerance=1e-2, require_speedup=True,
                     speed=at.SpeedCheck(rounds=1, seconds=0.001))
    assert {r.rule for r in report.replaced} == {"apart"}, str(report)
    assert "fused: the model takes 10 ms with it, 7 ms with apart apart: left out" in str(report)
    assert replays and all("fused" not in rules for rules in replays), replays
    assert len(wholes) == 1 + len(replays)  # the fusion check once, then one timing per try


def test_a_replacement_right_only_on_the_example_is_caught_on_held_out_batches(tmp_path):
    """The replacement is the example's output, a constant: exact on the example, wrong on any other batch."""
    model, args = mlp(), batch()
    with torch.no_grad():
        baked = model(*args)

    def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Any:
        out = next(n for n in gm.graph.nodes if n.op == "call_function" and G.module_path(n) == "4")

        def replace(gm: Any) -> tuple[Any, ...]:
            gm.register_buffer("autotune_baked", baked.clone())
            with gm.graph.inserting_before(out.next):
                return (gm.graph.get_attr("autotune_baked"),)

        yield GraphMatch("baked", (out,), (out,), (), replace, where="4", what="the example's output",
                         reduced=(Reduced(out.name, "4", "baked", lambda *a, **k: baked),))

    rule = GraphRule("baked", find, quantizes=True)
    _, alone = tune(model, args, tmp_path, rules=[rule], check_inputs=[])  # the example only: it passes
    assert precisions(alone) == {"4": "int8"} and [e.batch for e in alone.accuracy.errors] == ["example"]
    # ... and the test batch, which no decision saw, says what it is worth
    (test,) = alone.accuracy.tests
    assert test.batch == "test (drawn like the example)" and not test.holds
    assert "on test batches no decision saw, the tolerance BROKEN:" in str(alone)
    _, alone = tune(model, args, tmp_path, rules=[rule], check_inputs=[], test_inputs=[batch(7)])
    assert [(e.batch, e.holds) for e in alone.accuracy.tests] == [("test_inputs[0]", False)]
    _, drawn = tune(model, args, tmp_path, rules=[rule])
    assert precisions(drawn) == {"4": "fp32"} and not drawn.replaced and "unchanged" in drawn.note
    _, given = tune(model, args, tmp_path, rules=[rule], check_inputs=[batch(3), batch(4)])
    assert precisions(given) == {"4": "fp32"}
    assert [e.batch for e in given.accuracy.errors] == ["example", "check_inputs[0]", "check_inputs[1]"]
    assert given.accuracy.tests == [] or all(e.holds for e in given.accuracy.tests)


def test_fp32_rules_are_held_to_the_fp32_contract_and_a_model_that_breaks_it_comes_back_unchanged(tmp_path):
    model, args = mlp(), batch()

    def nudge(gm: Any, n: Any) -> Any:
        return gm.graph.call_function(aten.add.Tensor, (gm.graph.call_function(n.target, n.args), 1e-3))

    def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Any:
        n = next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.relu.default)

        def replace(gm: Any) -> tuple[Any, ...]:
            with gm.graph.inserting_before(n.next):
                return (nudge(gm, n),)

        yield GraphMatch("nudge", (n,), (n,), (), replace, tolerance=(0.0, 1e-2), where="1", what="relu + 1e-3")

    rule = GraphRule("nudge", find)  # fp32: agrees within its own 1e-2, not within the model's 1e-4
    opt, report = tune(model, args, tmp_path, rules=[rule], quantize=False)
    assert opt is model and not report.accuracy.holds and "breaks the tolerance" in report.note
    assert "BROKEN" in str(report) and report.accuracy.tolerance == A.FP32_EXACT
    opt, report = tune(model, args, tmp_path, rules=[rule], quantize=False, tolerance=1e-2)
    assert opt is not model and report.accuracy.holds


@pytest.mark.parametrize("bad, match", [
    (-1.0, "atol must be a number >= 0"), (math.nan, "atol must be a number >= 0"),
    ("1e-2", "tolerance must be a number"), (True, "tolerance must be a number"),
    ((1e-2, 1e-2), "tolerance must be a number")])
def test_a_bad_tolerance_is_a_clear_error_before_anything_runs(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        tune(mlp(), batch(), tmp_path, rules=[noisy_rule({"4": 0.0})], tolerance=bad)
    assert not (tmp_path / "logs").exists()


def test_the_tolerance_and_its_defaults():
    assert A.default_tolerance(None, quantize=True) == A.INT8 == at.Tolerance(atol=1e-2, rtol=1e-2)
    assert A.default_tolerance(None, quantize=False) == A.FP32_EXACT
    assert A.default_tolerance(0.05, quantize=True) == at.Tolerance(atol=0.05)
    assert A.default_tolerance(math.inf, quantize=True).allowed(torch.ones(3)) == math.inf
    with pytest.raises(ValueError, match="rtol must be a number >= 0"):
        at.Tolerance(rtol=-0.1)
    probabilities, logits = torch.tensor([0.1, 0.9]), torch.tensor([-30.0, 4.0])
    assert A.INT8.allowed(probabilities) == 1e-2  # absolute where outputs are within [-1, 1]
    assert A.INT8.allowed(logits) == pytest.approx(0.3)  # 1% of the range elsewhere
    assert str(A.INT8) == "max(0.01, 0.01 x max|eager|)" and str(at.Tolerance(atol=0.5)) == "0.5"
    e = A.output_error("b", (torch.tensor([0.5, 0.52]),), (torch.tensor([0.5, 0.5]),), A.INT8)
    assert e.error == pytest.approx(0.02) and not e.holds and e.ratio == pytest.approx(2.0)
    assert A.output_error("b", torch.ones(2, 2), torch.ones(2), A.INT8).ratio == math.inf  # another shape


def test_check_inputs_and_timing_batches_are_validated(tmp_path):
    model, args, rule = mlp(), batch(), noisy_rule({"4": 0.0})
    with pytest.raises(ValueError, match="check_inputs must be a list of batches"):
        tune(model, args, tmp_path, rules=[rule], check_inputs=torch.randn(4, 8))
    with pytest.raises(ValueError, match=r"raised RuntimeError on check_inputs\[0\]"):
        tune(model, args, tmp_path, rules=[rule], check_inputs=[torch.randn(4, 5)])
    with pytest.raises(ValueError, match="timing_batches must be an int >= 1"):
        tune(model, args, tmp_path, rules=[rule], timing_batches=0)


# ---- batches drawn like the example ---------------------------------------------------------------------------
def test_batches_drawn_like_the_example_keep_structure_and_validity():
    dense = torch.randn(64, 4)
    offsets = torch.arange(0, 128, 2)
    zipf = torch.tensor([0] * 60 + [1] * 30 + list(range(2, 40)))  # a hot head and a tail seen once, in
    zipf = zipf[torch.randperm(128, generator=torch.Generator().manual_seed(0))]  # no order (sorted: offsets)
    drawn = A.draw_like((dense, [zipf], [offsets], 3), seed=1)
    d, (z,), (o,), three = drawn
    assert d.shape == dense.shape and three == 3 and torch.equal(o, offsets)  # offsets (sorted) kept
    for j in range(4):  # each column drawn from its own values, mixing rows
        assert set(d[:, j].tolist()) <= set(dense[:, j].tolist())
    assert not torch.equal(d, dense)
    assert z.shape == zipf.shape and z.dtype == zipf.dtype and 0 <= int(z.min()) and int(z.max()) <= 39
    assert (z == 0).sum() > 20 and not torch.equal(z, zipf)  # the hot value stays hot
    seen = torch.tensor([99] + [0] * 60 + [17, 5])  # 3 values seen once in 63: about 4.8% of a draw is new values,
    spread = torch.cat([A.draw_like(seen, seed=s) for s in range(200)])  # uniform over [0, 99]
    share = float((~torch.isin(spread, seen)).float().mean())
    assert 0.03 < share < 0.065 and int(spread.max()) <= 99
    perm = A.draw_like(zipf, seed=2, fresh=False)
    assert sorted(perm.tolist()) == sorted(zipf.tolist()) and not torch.equal(perm, zipf)


def test_a_model_that_rejects_drawn_batches_is_checked_on_the_example_with_a_warning():
    class Strict(nn.Module):
        def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            if not torch.equal(lengths, torch.arange(lengths.numel(), 0, -1)):
                raise ValueError("lengths must count down")
            return x * 2

    args = (torch.randn(8, 3), torch.arange(8, 0, -1))
    with pytest.warns(UserWarning, match="checked on the example inputs only"):
        checks = A.check_batches(Strict(), args, None)
    assert [b.name for b in checks] == ["example"]
    assert A.timing_batches(Strict(), checks, 8) == [args]


# ---- timing on fresh batches ----------------------------------------------------------------------------------
def test_the_speed_check_cycles_through_the_timing_batches(monkeypatch):
    """Old and new code are timed on the example's values, then each timing batch's, in turn; a new get_attr
    (a packed weight) is an input the cycle keeps."""
    from autotune.torch import speed

    model = mlp()
    args, other = batch(0), batch(1)
    gm = G.capture(model, args)

    def doubled(gm: Any, n: Any) -> Any:
        gm.register_buffer("autotune_one", torch.ones(1))
        one = gm.graph.get_attr("autotune_one")
        return gm.graph.call_function(aten.mul.Tensor, (gm.graph.call_function(n.target, n.args), one))

    def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Any:
        n = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.relu.default][0]

        def replace(gm: Any) -> tuple[Any, ...]:
            with gm.graph.inserting_before(n.next):
                return (doubled(gm, n),)

        yield GraphMatch("times_one", (n,), (n,), (), replace, where="1", what="relu * 1")

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def time_pair(old: Any, new: Any, check: Any) -> tuple[float, float]:
        for _ in range(3):
            seen.append((old()[0], new()[0]))
        return 1.0, 0.5

    monkeypatch.setattr(speed, "time_pair", time_pair)
    done = G.rewrite(gm, args, [GraphRule("times_one", find)], speed=G.SpeedCheck(rounds=1, seconds=1e-3),
                     timing_inputs=[other])
    assert len(done.replaced) == 1, done.kept
    with torch.no_grad():
        first = torch.relu(model[0](args[0]))
        second = torch.relu(model[0](other[0]))
    assert [torch.equal(o, n) for o, n in seen] == [True] * 3
    assert torch.equal(seen[0][0], first) and torch.equal(seen[1][0], second) and torch.equal(seen[2][0], first)


def test_the_cheapest_layer_whose_share_covers_the_excess_moves_first():
    """Errors add at most: a layer whose share covers ratio - 1 may hold the contract alone, and of those the
    one with the least eager time gives up the least speed (the DLRM's top.2 before top.0, its shares alike);
    where none covers it, or without every layer's time, the largest share goes."""
    shares = {"top0": 0.69, "top2": 0.64, "table": 0.05}
    times = {"top0": 1.0e-3, "top2": 0.5e-3, "table": 0.2e-3}
    layers = [Reduced(n, n, n, lambda *a: None) for n in shares]
    costs = A.layer_costs(layers, times)
    assert costs == times
    assert A.next_to_fall_back(1.3, shares, costs) == "top2"  # both cover 0.3: the cheaper
    assert A.next_to_fall_back(1.67, shares, costs) == "top0"  # only top0 covers 0.67
    assert A.next_to_fall_back(3.0, shares, costs) == "top0"  # none covers 2: the largest share
    assert A.next_to_fall_back(1.3, shares) == "top0"  # no costs: the largest share
    assert A.next_to_fall_back(1.3, {"a": 0.5, "b": 0.5}, {"a": 1.0, "b": 1.0}) == "a"  # ties: graph order
    assert A.layer_costs(layers, {"top0": 1e-3, "top2": 5e-4}) is None  # the table's time unknown
    assert A.layer_costs(layers, {**times, "table": 0.0}) is None
