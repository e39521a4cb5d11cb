"""autotune.bench and autotune.roofline: PyTorch timed in a TVM-free process, fields and ratios of the result,
and the roofline microbenchmark (measured once, then cached). No timing figures are asserted."""

import json
import statistics
import subprocess
import sys

import numpy as np
import pytest
import torch

import autotune
import search_spaces
from autotune import bench as bench_mod
from autotune import roofline
from autotune.bench import IsolatedTorch, bench, format_result
from autotune import runtime
from autotune.bench_child import cycled_paths, torch_paths
from autotune.runtime import TaskData, Timing
from autotune.task import make_task

SHAPE = "rows=200,dim=8,batch=16,pooling=1-6"
QUICK = Timing(number=1, repeat=2, min_repeat_ms=1.0)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One roofline cache (and compiled microbenchmark) for the module's tests, not the user's."""
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def log(tmp_path_factory, cpu_builder, local_runner):
    from conftest import default_pools

    path = tmp_path_factory.mktemp("logs") / "eb.jsonl"
    with default_pools(cpu_builder, local_runner):  # the session's pools: no fresh TVM processes to start
        autotune.tune("embedding_bag", "cpu", log=path, trials=2, strategy="random", shape=SHAPE, progress=False)
    return path


def test_the_isolated_process_never_imports_tvm():
    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    child = IsolatedTorch(task, seed=0, timing=QUICK, torch_threads=1)
    try:
        medians = child.round()
    finally:
        child.close()
    w = task.workload
    assert set(medians) == set(torch_paths(task.template, w, task.template.inputs(w, 0)))
    assert all(t > 0 for t in medians.values())
    assert child.tvm_imported is False  # the child's own report of its sys.modules


def test_pytorch_is_timed_on_the_same_cycle_of_input_sets_as_the_kernels():
    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    data = runtime.TaskData(task.template, task.workload, 0, "cpu")
    assert len(data.sets) > 1
    paths = cycled_paths(task.template, task.workload, data.sets, runtime)
    assert set(paths) - {"torch"} <= {"fbgemm_tbe_float32"}  # FBGEMM's TBE: where fbgemm-gpu-cpu is installed
    for s in data.sets * 2:
        ref = task.template.reference(task.workload, *s)
        outs = {name: path() for name, path in paths.items()}
        assert torch.equal(outs.pop("torch"), ref)
        for out in outs.values():
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_templates_import_no_tvm_at_module_level():
    code = ("import sys, search_spaces\n"
            "for n in search_spaces.names(): search_spaces.get(n)\n"
            "print('tvm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_bench_json_has_both_pytorch_figures_and_the_roofline(log, cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", cache)
    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    res = bench(task, [log], rounds=2, timing=QUICK)
    j = res.to_json()
    assert {"tuned_s", "default_s", "torch_s", "torch_s_isolated", "torch_s_in_process", "speedup_vs_torch",
            "speedup_vs_torch_in_process", "speedup_vs_default", "gbps", "torch_gbps", "baselines_isolated",
            "baselines_in_process", "torch_process", "order", "roofline", "isolated_tvm_imported"} <= set(j)
    assert j["torch_process"] == "isolated" and j["isolated_tvm_imported"] is False
    assert j["torch_s"] == j["torch_s_isolated"] == min(j["baselines_isolated"].values())
    assert j["torch_s_in_process"] == min(j["baselines_in_process"].values())
    assert set(j["baselines_isolated"]) == set(j["baselines_in_process"])
    assert j["speedup_vs_torch"] == pytest.approx(j["torch_s_isolated"] / j["tuned_s"])
    assert j["speedup_vs_torch_in_process"] == pytest.approx(j["torch_s_in_process"] / j["tuned_s"])
    traffic = task.template.traffic(task.workload, *task.template.inputs(task.workload, 0))
    assert j["gbps"] == pytest.approx(traffic.bytes / j["tuned_s"] / 1e9)
    roof = j["roofline"]
    assert roof["name"] == "gather bandwidth of the same rows" and roof["unit"] == "GB/s" and roof["value"] > 0
    assert roof["share"] == pytest.approx(j["gbps"] / roof["value"])
    # measured in every round, beside the kernels; the median is the roof
    assert len(roof["samples"]) == j["rounds"] and roof["value"] == sorted(roof["samples"])[j["rounds"] // 2]
    assert json.loads(json.dumps(j)) == j
    text = format_result(task, res)
    assert "isolated" in text and "in-process" in text and "roofline" in text
    assert "gather bandwidth of the same rows" in text


def test_ratios_come_from_the_medians_of_the_rounds(log, cache, monkeypatch):
    """Each in-process contender gets a known time per round: the result holds their medians over rounds."""
    monkeypatch.setenv("XDG_CACHE_HOME", cache)
    calls = []

    def fake(fn, timing, runtime):
        calls.append(fn)
        return len(calls) * 1e-3

    monkeypatch.setattr(bench_mod, "median_time", fake)
    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    res = bench(task, [log], rounds=3, timing=QUICK, roof=False)
    per_round = 2 + len(res.baselines_in_process)  # tuned, default, then the torch paths, in that order
    assert len(calls) == 3 * per_round
    expect = [statistics.median((r * per_round + j + 1) * 1e-3 for r in range(3)) for j in range(per_round)]
    assert res.tuned_s == pytest.approx(expect[0]) and res.default_s == pytest.approx(expect[1])
    assert sorted(res.baselines_in_process.values()) == pytest.approx(expect[2:])
    assert res.speedup_vs_default == pytest.approx(expect[1] / expect[0])
    assert res.speedup_vs_torch == pytest.approx(min(res.baselines_isolated.values()) / expect[0])
    assert res.roof is None and res.to_json()["roofline"] is None


def test_peaks_are_positive_and_measured_once(cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", cache)
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    fma, int8 = roofline.fp32_peak(), roofline.int8_peak()
    assert fma.value > 0 and fma.unit == "GFLOPS" and int8.value > 0 and int8.unit == "GOPS"
    assert "int8" in int8.name

    def rerun(*args):
        raise AssertionError("a cached roof was measured again")

    monkeypatch.setattr(roofline, "_run", rerun)
    assert roofline.fp32_peak() == fma and roofline.int8_peak() == int8
    assert roofline.for_unit("GFLOPS") == fma and roofline.for_unit("GOPS") == int8
    monkeypatch.setenv("TVM_NUM_THREADS", "2")  # another thread count is another machine state: measured anew
    with pytest.raises(AssertionError, match="measured again"):
        roofline.fp32_peak()


def test_gather_bandwidth_is_cached_per_table_shape(cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", cache)
    sweep = roofline.gather_sweep(300, 4, n=1 << 14)
    assert {"sequential", "steady"} <= set(sweep) and any(k.startswith("prefetch") for k in sweep)
    assert min(sweep.values()) > 0
    roof = roofline.for_unit("GB/s", (300, 4))
    assert roof.value > 0 and roof.unit == "GB/s"
    monkeypatch.setattr(roofline, "_run", lambda *a: pytest.fail("measured again"))
    assert roofline.gather_bandwidth(300, 4) == roof
    assert not (roofline.cache_dir() / "roofline.json").exists()  # measured in this run, never stored


def test_the_gather_roof_is_the_best_distance_timed_as_kernels_are(monkeypatch):
    """The roof is the sweep's "steady" figure (the best distance, the median of 100 ms repeats, as bench times a
    kernel), not the sweep's best-of over short passes: a kernel's median would be compared with a lucky moment."""
    monkeypatch.setattr(roofline, "gather_sweep", lambda *a, **k: {"prefetch 0": 9.0, "prefetch 32": 12.0,
                                                                    "steady": 10.5, "sequential": 30.0})
    assert roofline.gather_bandwidth(301, 4, fresh=True).value == 10.5


def test_a_gather_roof_of_given_rows_gathers_those(cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", cache)
    stream = np.arange(1 << 14) % 7  # hot rows: the roof of this traffic, not of uniform rows
    roof = roofline.for_unit("GB/s", (300, 4), indices=stream)
    assert roof.value > 0 and roof.name == "gather bandwidth of the same rows"
    def rerun(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(roofline, "_run", rerun)
    assert roofline.gather_bandwidth(300, 4, indices=stream.copy()) == roof  # the same rows: measured once
    with pytest.raises(AssertionError, match="measured again"):
        roofline.gather_bandwidth(300, 4, indices=stream[::-1].copy())
    for bad in (np.array([0, 300]), np.array([-1]), np.array([], dtype=np.int64)):
        with pytest.raises(ValueError, match="rows in"):
            roofline.gather_sweep(300, 4, indices=bad)


def test_the_bench_roof_gathers_the_timed_sets_rows():
    task = make_task("embedding_bag", "cpu", shape="rows=50,dim=8,batch=4,pooling=2")
    data = TaskData(task.template, task.workload, 0, "cpu")
    stream = bench_mod.gathered_stream(task.template, task.workload, data.sets)
    assert stream.tolist() == torch.cat([s[1] for s in data.sets]).tolist()
    assert bench_mod.gathered_stream(search_spaces.get("qmatmul"), None, data.sets) is None  # no such member


def test_no_compiler_is_one_clear_message_and_no_roof(tmp_path, monkeypatch):
    monkeypatch.setattr(roofline, "_MEASURED", {})  # nothing measured yet in this process
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-cc")
    with pytest.raises(roofline.RooflineUnavailable, match="no C compiler"):
        roofline.fp32_peak()
    roof, why = bench_mod.measure_roof("GFLOPS", ())
    assert roof is None and "no C compiler" in why and "\n" not in why


@pytest.mark.parametrize("unit, shape", [("GB/s", ()), ("TB/s", (4, 4))])
def test_bad_roof_requests_are_clear_errors(unit, shape):
    with pytest.raises(ValueError):
        roofline.for_unit(unit, shape)
