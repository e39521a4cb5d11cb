"""The embedding-bag template against torch.nn.functional.embedding_bag, for random configs of its space."""

import random

import pytest
import torch

from autotune.build import compile_module
from autotune.task import make_task
from search_spaces import WorkloadError
from search_spaces import embedding_bag as eb

CASES = {
    "sum": dict(),
    "mean": dict(mode="mean"),
    "max": dict(mode="max"),
    "weighted": dict(per_sample_weights=True),
    "pad-sum": dict(padding_idx=3),
    "pad-mean": dict(padding_idx=3, mode="mean"),
    "pad-max": dict(padding_idx=-1, mode="max"),
    "last-offset-int32": dict(include_last_offset=True, index_dtype="int32"),
    "last-offset-mean": dict(include_last_offset=True, mode="mean"),
    "zipf-int32": dict(distribution="zipf", zipf_exponent=1.2, index_dtype="int32"),
}


def run(task, cfg, *tensors):
    func = compile_module(task, cfg)["main"]
    args, out = task.kernel_args(cfg, (), tensors)
    func(*args)
    return out


@pytest.mark.parametrize("case", CASES)
def test_matches_torch_for_default_and_random_configs(case):
    # pooling from 0 gives empty bags; dim 24 is not a multiple of the 16-lane option
    task = make_task("embedding_bag", "cpu", rows=50, dim=24, batch=13, pooling=(0, 7), **CASES[case])
    rng = random.Random(hash(case) % 1000)
    configs = {task.space.default()} | {task.space.sample(rng) for _ in range(2)}
    tensors = eb.inputs(task.workload, seed=3)
    ref = eb.reference(task.workload, *tensors)
    for cfg in configs:
        torch.testing.assert_close(run(task, cfg, *tensors), ref, rtol=1e-5, atol=1e-5, msg=str(cfg))


def test_every_knob_value_builds_and_matches():
    """Each value of each knob appears in at least one checked config."""
    task = make_task("embedding_bag", "cpu", rows=64, dim=32, batch=9, pooling=(0, 12))
    tensors = eb.inputs(task.workload, seed=1)
    ref = eb.reference(task.workload, *tensors)
    rng = random.Random(0)
    for knob in task.space.knobs:
        for value in knob.values:
            cfg = next(c for c in (task.space.sample(rng) for _ in range(5000)) if c[knob] == value)
            torch.testing.assert_close(run(task, cfg, *tensors), ref, rtol=1e-5, atol=1e-5, msg=str(cfg))


def test_edge_cases_single_bag_all_empty_and_all_padding():
    task = make_task("embedding_bag", "cpu", rows=10, dim=8, batch=1, pooling=(3, 3), mode="mean", padding_idx=0)
    cfg = task.space.default()
    weight = torch.randn(10, 8)
    for indices in (torch.tensor([1, 2, 3]), torch.tensor([0, 0, 0]), torch.tensor([0, 5, 0])):
        offsets = torch.tensor([0])
        ref = eb.reference(task.workload, weight, indices, offsets)
        torch.testing.assert_close(run(task, cfg, weight, indices, offsets), ref)
    # every bag empty (offsets all equal to 0 with no indices)
    task = make_task("embedding_bag", "cpu", rows=10, dim=8, batch=4, pooling=(0, 0), mode="max")
    empty = (weight, torch.zeros(0, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    out = run(task, task.space.default(), *empty)
    assert out.shape == (4, 8) and torch.equal(out, torch.zeros(4, 8))
    torch.testing.assert_close(out, eb.reference(task.workload, *empty))


def test_kernel_serves_other_batch_sizes_than_tuned():
    task = make_task("embedding_bag", "cpu", rows=30, dim=16, batch=8, pooling=(1, 5))
    other = eb.Workload(rows=30, dim=16, batch=21, pooling=(1, 5))
    tensors = eb.inputs(other, seed=2)
    torch.testing.assert_close(run(task, task.space.default(), *tensors), eb.reference(other, *tensors))


def test_zipf_indices_are_skewed_and_in_range():
    w = eb.Workload(rows=10_000, dim=4, batch=512, pooling=(20, 20), distribution="zipf", zipf_exponent=1.1)
    _, idx, _ = eb.inputs(w, seed=0)
    assert 0 <= int(idx.min()) and int(idx.max()) < 10_000
    counts = torch.bincount(idx, minlength=10_000).sort(descending=True).values
    assert counts[:100].sum() > 0.3 * idx.numel()  # the hottest 1% of rows takes a large share
    _, uni, _ = eb.inputs(eb.Workload(rows=10_000, dim=4, batch=512, pooling=(20, 20)), seed=0)
    assert torch.bincount(uni, minlength=10_000).sort(descending=True).values[:100].sum() < 0.05 * uni.numel()


@pytest.mark.parametrize("shape, message", [
    ("rows=10,dim=8,batch=2", "missing pooling"),
    ("rows=10,dim=8,batch=2,pooling=5-3", "min <= max"),
    ("rows=10,dim=8,batch=2,pooling=x", "pooling"),
    ("rows=10,dim=8,batch=2,pooling=3,mode=avg", "mode"),
    ("rows=10,dim=8,batch=2,pooling=3,mode=mean,weighted=1", "per_sample_weights"),
    ("rows=10,dim=8,batch=2,pooling=3,padding_idx=10", "padding_idx"),
    ("rows=10,dim=0,batch=2,pooling=3", "dim"),
    ("rows=10,dim=8,batch=2,pooling=3,colour=red", "unknown shape key"),
    ("rows=10,dim=8,batch=2,pooling=3,dist=zipf:x", "zipf"),
    ("rows=10 dim=8", "expected int"),
    ("rows=10,,dim", "key=value"),
])
def test_bad_shapes_are_clear_errors(shape, message):
    with pytest.raises(WorkloadError, match=message):
        eb.Workload.from_shape(shape)


def test_shape_text_parses_aliases_and_ranges():
    w = eb.Workload.from_shape("rows=100,dim=8,batch=4,pooling=2-9,index=int32,dist=zipf:1.3,weighted=1")
    assert w.pooling == (2, 9) and w.index_dtype == "int32" and w.per_sample_weights
    assert w.distribution == "zipf" and w.zipf_exponent == 1.3
    assert eb.Workload.from_json(w.to_json()) == w


def test_check_inputs_rejects_bad_tensors():
    w = eb.Workload(rows=10, dim=4, batch=2, pooling=(1, 2))
    weight, idx, off = torch.randn(10, 4), torch.tensor([1, 2, 3]), torch.tensor([0, 2])
    eb.check_inputs(w, weight, idx, off)
    with pytest.raises(IndexError, match=r"\[0, 10\)"):
        eb.check_inputs(w, weight, torch.tensor([1, 10, 3]), off)
    with pytest.raises(IndexError):
        eb.check_inputs(w, weight, torch.tensor([-1, 2, 3]), off)
    with pytest.raises(TypeError, match="int64"):
        eb.check_inputs(w, weight, idx.int(), off.int())
    with pytest.raises(TypeError, match="float32"):
        eb.check_inputs(w, weight.double(), idx, off)
    with pytest.raises(ValueError, match=r"\(rows, 4\)"):
        eb.check_inputs(w, torch.randn(10, 5), idx, off)
    with pytest.raises(ValueError, match="non-decreasing"):
        eb.check_inputs(w, weight, idx, torch.tensor([0, 2, 1]))
    with pytest.raises(ValueError, match="exceeds"):
        eb.check_inputs(w, weight, idx, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="offsets\\[0\\]"):
        eb.check_inputs(w, weight, idx, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="contiguous"):
        eb.check_inputs(w, torch.randn(4, 10).t(), idx, off)
    with pytest.raises(ValueError, match="without per_sample_weights"):
        eb.check_inputs(w, weight, idx, off, torch.ones(3))
