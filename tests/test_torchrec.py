"""TorchRec models as TorchRec builds them (an EmbeddingBagCollection fed a KeyedJaggedTensor): captured with
their KJT input, drawn per feature, seen through what the exporter emits, and tuned end to end (`slow`: 1-2
trials per task) as DLRM and DLRM_DCN, the rewritten model taking KJTs of other batch sizes and bag lengths.

torchrec is the project's `torchrec` extra (`make install` installs it with --no-deps); a missing torchrec
fails these tests, as a missing build does (tests/conftest.py: requires_build)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from conftest import requires_build

pytestmark = requires_build("torchrec", lambda: importlib.util.find_spec("torchrec") is not None,
                            "make install installs the torchrec extra (pip install --no-deps torchrec==1.8.0 and "
                            "its pins, pyproject.toml)")

ROWS = (50, 30, 20, 40)
DIM = 16
aten = torch.ops.aten


def ebc(rows: tuple[int, ...] = ROWS, dim: int = DIM) -> Any:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    return EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=r,
                                                             feature_names=[f"f{i}"]) for i, r in enumerate(rows)],
                                  device=torch.device("cpu"))


def dlrm(kind: str = "dlrm", rank: int = 8) -> torch.nn.Module:
    from torchrec.models.dlrm import DLRM, DLRM_DCN

    torch.manual_seed(0)
    kw = dict(embedding_bag_collection=ebc(), dense_in_features=5, dense_arch_layer_sizes=[32, DIM],
              over_arch_layer_sizes=[32, 1])
    if kind == "dcn":
        return DLRM_DCN(**kw, dcn_num_layers=2, dcn_low_rank_dim=rank).eval()
    return DLRM(**kw).eval()


def batch(size: int, seed: int = 0, most: int = 3, rows: tuple[int, ...] = ROWS) -> tuple[torch.Tensor, Any]:
    """Dense features and a KJT of bags of 1..`most` ids per sample and feature, each within its table."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, most + 1, (len(rows) * size,), generator=g)
    values = [torch.randint(0, r, (int(lengths[f * size:(f + 1) * size].sum()),), generator=g)
              for f, r in enumerate(rows)]
    return torch.randn(size, 5, generator=g), KeyedJaggedTensor(keys=[f"f{i}" for i in range(len(rows))],
                                                                values=torch.cat(values), lengths=lengths)


# ---- capture and draws (no tuning) ------------------------------------------------------------------------------
def test_a_kjt_input_is_captured_with_its_batch_dynamic_and_the_exporters_no_ops_taken_out():
    from autotune.torch.capture import capture

    model = dlrm()
    gm = capture(model, batch(8))
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten._assert_tensor_metadata.default not in targets
    assert not any(n.target is aten.to.dtype and n.args[1] == torch.float32 for n in gm.graph.nodes
                   if n.op == "call_function")  # the bags' .float() on float32
    # the pooled embeddings' cat -> split by key -> cat is one cat of the bags
    bags = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.embedding_bag.padding_idx]
    cats = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.cat.default
            and any(getattr(a, "args", (None,))[0] in bags for a in n.args[0])]
    assert len(bags) == len(ROWS) and len(cats) == 1
    for size, seed in ((3, 1), (21, 2)):  # another batch, other bag lengths: the graph takes the KJT as it is
        args = batch(size, seed, most=5)
        with torch.no_grad():
            torch.testing.assert_close(gm(*args), model(*args), rtol=0, atol=0)


def test_simplify_leaves_what_computes_something():
    from autotune.torch.capture import capture

    class Casts(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> Any:
            same = torch.split(torch.cat([a, b], 1), [3, 4], 1)  # back to a and b: taken out
            other = torch.split(torch.cat([a, b], 1), [4, 3], 1)  # other sizes: kept
            return same[0].float() * 2, same[1], other[0].double(), other[1]

    args = (torch.randn(6, 3), torch.randn(6, 4))
    gm = capture(Casts(), args)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(aten.split_with_sizes.default) == 1 and targets.count(aten.cat.default) == 1
    assert any(n.target is aten.to.dtype and n.args[1] == torch.float64 for n in gm.graph.nodes)
    for got, want in zip(gm(*args), Casts()(*args)):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_simplify_rejoins_a_tensors_row_blocks_put_back_in_order():
    """cat of (B, T, D)'s T blocks in order along dim 1 is its (B, T*D) source (what the table-batched launch's
    per-table views become in TorchRec's KeyedTensor); another order is a real permutation and stays."""
    from autotune.torch.capture import capture

    class Blocks(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            v = (x * 2).view(-1, 3, 4)
            same = torch.cat([v[:, 0], v[:, 1], v[:, 2]], 1)
            other = torch.cat([v[:, 1], v[:, 0], v[:, 2]], 1)
            return same + 1, other

    args = (torch.randn(5, 12),)
    gm = capture(Blocks(), args)
    assert [n.target for n in gm.graph.nodes].count(aten.cat.default) == 1
    for got, want in zip(gm(*args), Blocks()(*args)):
        assert torch.equal(got, want)


def test_a_kjt_is_drawn_feature_by_feature_within_each_features_ids():
    from autotune.torch.draw import draw_like

    dense, kjt = batch(64, most=4, rows=(1000, 3, 50, 7))
    got_dense, got = draw_like((dense, kjt), seed=3)
    assert type(got) is type(kjt) and got.keys() == kjt.keys() and got_dense.shape == dense.shape
    assert got.stride() == kjt.stride() and got.values().numel() == kjt.values().numel()
    changed = False
    for key in kjt.keys():
        old, new = kjt[key], got[key]
        assert sorted(new.lengths().tolist()) == sorted(old.lengths().tolist())  # bag sizes as the example's
        assert int(new.values().min()) >= int(old.values().min()) and int(new.values().max()) <= int(old.values().max())
        changed |= not torch.equal(new.values(), old.values())
    assert changed
    assert (got._lengths is None) == (kjt._lengths is None) and (got._offsets is None) == (kjt._offsets is None)
    again = draw_like((dense, kjt), seed=3, fresh=False)[1]  # permuted within each feature, lengths kept
    for key in kjt.keys():
        assert torch.equal(again[key].lengths(), kjt[key].lengths())
        assert sorted(again[key].values().tolist()) == sorted(kjt[key].values().tolist())


def test_torchrec_rules_find_the_fused_stage_and_the_interaction_in_triu_order():
    from autotune.torch.capture import capture
    from autotune.torch.graph import discover
    from autotune.torch.rules import collect_rules

    model, args = dlrm(), batch(8)
    found = discover(capture(model, args), args, collect_rules(False))
    assert "embedding_interaction" in {m.rule for m in found.matches}
    assert {"batched_embedding_bag", "interaction"} <= {m.rule for m in found.alternatives}
    inter = next(m for m in found.alternatives if m.rule == "interaction")
    assert "in the model's order" in inter.what
    assert not [k for k in found.kept if k.rule in ("interaction", "embedding_interaction")], found.kept


def test_the_table_batched_task_carries_each_features_pooling():
    """A KJT whose features pool differently (as MLPerf's multi-hot ones): the batched launch is tuned on bags of
    each table's own sizes, where the (table, bag) order decides how the cores share the work."""
    from autotune.torch.capture import capture
    from autotune.torch.graph import discover
    from autotune.torch.rules import collect_rules
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    pooling, size = (1, 3, 2, 5), 8
    g = torch.Generator().manual_seed(0)
    kjt = KeyedJaggedTensor(keys=[f"f{i}" for i in range(len(ROWS))],
                            values=torch.cat([torch.randint(0, r, (p * size,), generator=g)
                                              for r, p in zip(ROWS, pooling)]),
                            lengths=torch.tensor(pooling).repeat_interleave(size))
    model, args = dlrm("dcn"), (torch.randn(size, 5, generator=g), kjt)
    found = discover(capture(model, args), args, collect_rules(True))  # int8: the int8-row tables' launch
    [fields] = [f for m in [*found.matches, *found.alternatives] for op, f in m.tasks if op == "batched_embedding_bag"]
    assert fields["table_pooling"] == tuple((p, p) for p in pooling) and fields["pooling"] == (1, 5)


def test_pairs_in_any_order_are_served_with_their_order_and_others_refused():
    from search_spaces.interaction.graph import self_interaction_of

    f = 4
    tril = list(zip(*torch.tril_indices(f, f, offset=-1).tolist()))
    triu = list(zip(*torch.triu_indices(f, f, offset=1).tolist()))
    assert self_interaction_of(tril, f) == (False, None)
    diagonal, order = self_interaction_of(triu, f)
    assert diagonal is False and [tril[k] for k in order] == [(j, i) for i, j in triu]
    assert isinstance(self_interaction_of(triu[:-1] + triu[:1], f), str)  # a pair twice, one missing
    with_diagonal = list(zip(*torch.triu_indices(f, f, offset=0).tolist()))
    assert self_interaction_of(with_diagonal, f)[0] is True


# ---- end to end ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shared_workers(cpu_builder, local_runner):
    from conftest import BRIEF, default_pools

    with default_pools(cpu_builder, local_runner, timing=BRIEF) as asked:
        yield asked


@pytest.mark.slow
@pytest.mark.parametrize("kind, quantize", [("dlrm", False), ("dcn", True)])
def test_a_torchrec_model_is_tuned_as_written_and_takes_any_kjt(kind, quantize, tmp_path, shared_workers):
    """DLRM in fp32-exact (the fused gather + interaction); DLRM_DCN in int8, each cross layer's V -> W chain
    ending in qmatmul_cross (its tail the kernel's epilogue), the cross network's state bfloat16."""
    import autotune.torch as at
    from search_spaces.qmatmul.graph import cat_as

    import search_spaces

    model, args = dlrm(kind, rank=32), batch(8)
    # int8: the rules this test is about (the table-batched launch, the int8 chains and their cross tails); the
    # others' alternatives (bf16 and split_linear Linears, single bags) would triple its tuning
    rules = [r for op in ("batched_embedding_bag", "qmatmul") for r in search_spaces.get(op).graph_rules()]
    opt, report = at.tune_model(model, args, log_dir=tmp_path / "logs", trials=1, quantize=quantize, progress=False,
                                bench_rounds=0, require_speedup=False, rules=rules if quantize else None,
                                timing_batches=2)
    rules = {r.rule for r in report.replaced}
    want = "embedding_interaction" if kind == "dlrm" else "batched_embedding_bag"
    assert any(r.startswith(want) for r in rules), str(report)
    if quantize:
        ops = {n.target for n in opt.graph.nodes if n.op == "call_function"}
        assert torch.ops.autotune.qmatmul_cross.default in ops and aten.mul.Tensor not in ops, str(report)
        # its two cross layers as one network on bfloat16 state, x0 written so by TorchRec's cat
        assert any("DCN cross network of 2 layers, bfloat16 state" in r.what for r in report.replaced), str(report)
        assert cat_as in ops and aten._to_copy.default not in ops
    # the batched launch's per-table views are not copied back together (KeyedTensor's cat of them)
    assert not any(n.target is aten.cat.default and any(getattr(a, "target", None) is aten.select.int
                                                        for a in n.args[0]) for n in opt.graph.nodes)
    assert report.accuracy is not None and report.accuracy.holds and len(report.accuracy.errors) == 2, str(report)
    ops = {n.target for n in opt.graph.nodes if n.op == "call_function"}
    assert getattr(torch.ops.autotune, want).default in ops
    assert aten.embedding_bag.padding_idx not in ops
    for size, seed in ((13, 5), (2, 6)):
        other = batch(size, seed, most=6)
        with torch.inference_mode():
            got, want_out = opt(*other), model(*other)
        bound = 1e-2 * max(1.0, float(want_out.abs().max())) if quantize else 1e-4  # tune_model's contracts
        torch.testing.assert_close(got, want_out, rtol=0, atol=bound)


# ---- examples/torchrec_dlrm.py (no tuning: its `ours` rows are tune_model's, tested above) -----------------------
def _example() -> Any:
    import sys
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "examples"
    sys.path.insert(0, str(folder))  # it imports its sibling, examples/dlrm.py
    try:
        spec = importlib.util.spec_from_file_location("torchrec_dlrm_example", folder / "torchrec_dlrm.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["torchrec_dlrm_example"] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


@pytest.mark.parametrize("kind", ["dlrm", "dcn"])
def test_the_examples_models_take_mlperfs_tables_and_pooling_and_the_unpacked_peer_agrees(kind):
    ex = _example()
    model, rows = ex.build(kind, max_rows=64)
    assert len(rows) == 26 and max(rows) == 64 and min(rows) == 3
    dense, kjt = ex.make_batch(rows, ex.MODELS[kind]["pooling"], 8, seed=0)
    assert kjt.values().numel() == 8 * (214 if kind == "dcn" else 26)
    with torch.no_grad():
        want = model(dense, kjt)
        torch.testing.assert_close(ex.Unpacked(model)(dense, *ex.Unpacked.split(kjt, clone=True)), want,
                                   rtol=0, atol=0)
    with pytest.raises(SystemExit):
        ex.parse(["--budget", "0"])
    assert ex.parse(["--model", "dlrm", "--trials", "2"]).model == ["dlrm"]
