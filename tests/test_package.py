"""Kernel packages: exported from records, run where TVM's compiler is not installed."""

import json
import random
import subprocess
import sys

import pytest

from autotune.package import export, read_manifest
from autotune.task import make_task

RUN = """
import json, sys
sys.path.insert(0, PKG)
import autotune_runtime as rt, search_spaces
manifest = json.load(open(PKG + "/manifest.json"))
rt.load_runtime(PKG + "/lib")
for entry in manifest["kernels"]:
    template = search_spaces.get(entry["op"])
    w = template.Workload.from_json(entry["workload"])
    data = rt.TaskData(template, w, 1, "cpu")
    func = rt.load_function(PKG + "/" + entry["file"])
    cfg = __import__("search_spaces.space", fromlist=["Config"]).Config(tuple(entry["config"].items()))
    costs, kind, err = rt.check_and_time(data, data.bind(cfg, func), rt.Timing(1, 2, 1.0))
    print(entry["op"], kind, err, len(costs))
print("tvm" in sys.modules)
"""


def test_exported_cpu_kernels_run_and_check_without_the_tvm_compiler(tmp_path, cpu_builder):
    task = make_task("embedding_bag", "cpu", rows=100, dim=16, batch=8, pooling=(0, 5), mode="mean")
    rec = task.record(task.space.default(), costs=(1e-5,), error_kind=None, error=None, build_s=0.1)
    manifest = export([rec], tmp_path / "pkg", builder=cpu_builder)  # (export's own pool: test_torch_ops)
    assert read_manifest(tmp_path / "pkg") == manifest
    (entry,) = manifest["kernels"]
    assert entry["op"] == "embedding_bag" and entry["config"] == rec.config and entry["latency_s"] == 1e-5
    assert (tmp_path / "pkg" / "lib" / "libtvm_runtime.so").exists()
    assert not (tmp_path / "pkg" / "lib" / "libtvm_runtime_cuda.so").exists()  # CPU only: no CUDA runtime

    fake = tmp_path / "notvm" / "tvm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no TVM compiler here')\n")
    proc = subprocess.run([sys.executable, "-c", RUN.replace("PKG", repr(str(tmp_path / "pkg")))],
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(fake.parent)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["embedding_bag None None 2", "False"]


def test_exporting_again_builds_only_what_the_package_does_not_already_hold(tmp_path, cpu_builder):
    """A kernel an earlier export to the same directory built (same name: op, workload, device, config, template
    version; same target, TVM and file digest) is kept, not built again; one altered on disk is rebuilt."""
    task = make_task("embedding_bag", "cpu", rows=100, dim=16, batch=8, pooling=(0, 5), mode="mean")
    default = task.space.default()
    rng = random.Random(0)
    other = next(c for c in (task.space.sample(rng) for _ in range(50)) if c != default)
    recs = [task.record(c, costs=(1e-5,), error_kind=None, error=None, build_s=0.1) for c in (default, other)]
    built: list[object] = []

    class Counting:
        def build(self, t, configs):
            built.extend(configs)
            return cpu_builder.build(t, configs)

    first = export(recs[:1], tmp_path / "pkg", builder=Counting())
    assert len(built) == 1
    second = export(recs, tmp_path / "pkg", builder=Counting())
    assert built == [default, other]  # the first kernel kept, the second built
    assert second["kernels"][0]["sha256"] == first["kernels"][0]["sha256"]
    lib = tmp_path / "pkg" / second["kernels"][0]["file"]
    lib.write_bytes(lib.read_bytes() + b"\0")  # altered: no longer the kernel the manifest lists
    third = export(recs, tmp_path / "pkg", builder=Counting())
    assert built == [default, other, default] and third["kernels"][0]["sha256"] == first["kernels"][0]["sha256"]


def test_reading_a_broken_package_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no kernel package"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="package format 99"):
        read_manifest(tmp_path)


def test_gpu_packages_carry_cubins_and_the_cuda_runtime(tmp_path, gpu_builder):
    task = make_task("embedding_bag", "cuda:sm_90", rows=100, dim=32, batch=8, pooling=(0, 5))
    rec = task.record(task.space.default(), costs=(2e-6,), error_kind=None, error=None, build_s=0.1)
    (entry,) = export([rec], tmp_path / "pkg", builder=gpu_builder)["kernels"]
    lib = tmp_path / "pkg" / "lib"
    assert entry["device"] == "cuda:sm_90"
    assert (lib / "libtvm_runtime_cuda.so").exists() and list(lib.glob("libcudart.so.*"))
    assert b".nv.info" in (tmp_path / "pkg" / entry["file"]).read_bytes()  # a compiled cubin, not CUDA source


def test_exporting_onto_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "pkg").write_text("not a directory")
    with pytest.raises(ValueError, match="is a file"):
        export([], tmp_path / "pkg")
