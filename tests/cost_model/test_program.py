"""Program features (cost_model.program) of every template's lowered IR, on CPU and CUDA targets."""

from __future__ import annotations

import math
import random
import subprocess
import sys

import pytest

import search_spaces
from autotune.task import make_task
from cost_model import program
from cost_model.program import program_features

OPS = search_spaces.names()


def _task(op: str, device: str = "cpu"):
    return make_task(op, device, shape=search_spaces.get(op).TEST_SHAPE)


def _features(task, cfg):
    return program_features(task.lower(cfg), task.device.target())


@pytest.mark.parametrize("op", OPS)
def test_every_template_gets_finite_per_store_features(op):
    task = _task(op)
    feats = _features(task, task.space.default())
    assert feats and all(k.startswith("p.") and math.isfinite(v) for k, v in feats.items())
    assert feats["p.stores"] >= 1  # TVM's extractor coped, not the fallback
    sums = sorted(k.removeprefix("p.sum.") for k in feats if k.startswith("p.sum."))
    assert sums and sums == sorted(k.removeprefix("p.max.") for k in feats if k.startswith("p.max."))
    assert len(feats) == 2 * len(sums) + 1


def test_different_configs_give_different_features():
    task = _task("qmatmul")
    rng = random.Random(0)
    configs = dict.fromkeys([task.space.default(), *(task.space.sample(rng) for _ in range(4))])
    vectors = {tuple(sorted(_features(task, c).items())) for c in configs}
    assert len(configs) > 1 and len(vectors) > 1


def test_the_loop_nest_walk_stands_in_when_the_extractor_fails(monkeypatch):
    task = _task("embedding_bag")
    mod = task.lower(task.space.default())

    def broken(*args):
        raise RuntimeError("extractor failed")

    monkeypatch.setattr(program, "_per_store", broken)
    feats = program_features(mod, task.device.target())
    assert feats and all(k.startswith("p.loop.") and math.isfinite(v) for k, v in feats.items())
    assert feats["p.loop.stores"] >= 1 and feats["p.loop.loads"] >= 1 and feats["p.loop.depth"] >= 2
    assert feats["p.loop.n.parallel"] + feats["p.loop.n.vectorized"] >= 1  # the CPU schedule's loop kinds
    monkeypatch.setattr(program, "_loop_nest", broken)
    assert program_features(mod, task.device.target()) == {}  # both failed: nothing, not an exception


def test_cuda_lowering_is_featurized_without_a_gpu():
    task = _task("qmatmul", "cuda:sm_90")
    mod = task.lower(task.space.default())
    feats = program_features(mod, task.device.target())
    assert feats["p.stores"] >= 1 and all(math.isfinite(v) for v in feats.values())
    assert program._loop_nest(mod)["p.loop.n.thread_binding"] >= 1  # GPU threads are loops of their own kind
    cpu = _task("qmatmul")
    assert feats != _features(cpu, cpu.space.default())


def test_importing_the_module_does_not_import_tvm():
    code = "import sys, cost_model.program; assert 'tvm' not in sys.modules, 'tvm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
