"""The GPU check without a GPU (CI has none): `benchmarks/gpu_check.py prepare`'s directory, the device-side chain
run by the device image's Python (3.12) with the carried apache-tvm-ffi wheel over a stub CUDA driver, the
fallback launcher, check.py's arguments and supervision (a candidate that hangs, crashes or fails to load), and
`ingest`. What needs a GPU (the timings, PyTorch's CUDA paths) runs only on one: benchmarks/GPU.md.

One tiny prepared directory (every operator at a small shape, its default config) serves all tests: building it
is most of this file's time."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from autotune import records

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
TINY = {"embedding_bag": "rows=1000,dim=64,batch=64,pooling=1-8",
        "batched_embedding_bag": "rows=100+200,dim=32,batch=16,pooling=1-4",
        "interaction": "batch=64,tables=5,dim=16",
        "qmatmul": "m=64,k=64,n=64",
        "qmatmul_requant": "m=64,k=64,n=64",  # TVM's host code passes it workspaces: the launcher must too
        "quantize_rows": "rows=64,cols=100"}


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


gpu_check = _load("gpu_check", BENCHMARKS / "gpu_check.py")
cuda_launcher = _load("cuda_launcher", BENCHMARKS / "gpu_device" / "cuda_launcher.py")
DEVICE_PYTHON = gpu_check.device_python()
# The device image runs Python 3.12: its chain (the cp312 wheel, this Python's ctypes and DLPack) can only be run
# by that version. A machine without one skips these tests, and only these.
needs_device_python = pytest.mark.skipif(
    DEVICE_PYTHON is None, reason="no Python 3.12 here (the GPU machine's version: the carried apache-tvm-ffi wheel "
                                  "is for it); set GPU_CHECK_PYTHON to one")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """(the prepared directory, prepare's summary): made once per test session, also under pytest-xdist (the
    first worker prepares under a lock in the session's shared temporary directory, the others reuse it)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, not the last one's
    out, summary_file = shared / "gpu-check-prepared", shared / "gpu-check-prepared.json"
    with open(shared / "gpu-check-prepared.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not summary_file.exists():
            shutil.rmtree(out, ignore_errors=True)  # a session that failed half-way
            summary = gpu_check.prepare(out, candidates=1, shapes={op: (s,) for op, s in TINY.items()},
                                        say=lambda m: None)
            summary_file.write_text(json.dumps(summary))
    return out, json.loads(summary_file.read_text())


def _copy(prepared, tmp_path) -> Path:
    dest = tmp_path / "dir"
    shutil.copytree(prepared[0], dest)
    return dest


def _batch(root, op):
    return next(root / name for name in json.loads((root / "plan.json").read_text())["batches"]
                if json.loads((root / name / "batch.json").read_text())["op"] == op)


def test_prepare_writes_everything_the_device_needs(prepared, tmp_path):
    out, summary = prepared
    plan = json.loads((out / "plan.json").read_text())
    assert plan["device"] == "cuda:sm_90" and plan["roofs"]["bandwidth"] == 4.8e12
    assert len(plan["batches"]) == len(TINY)
    for name in plan["batches"]:
        spec = json.loads((out / name / "batch.json").read_text())
        assert spec["template_version"] == records.current_version(spec["op"], "cuda:sm_90")
        assert spec["roof"] == ("int8_tc" if spec["op"].startswith("qmatmul") else "bytes")
        (cand,) = spec["candidates"]
        assert cand["launch"]["kernels"] and cand["launch"]["cubin"] == "c000.cubin", cand.get("launch_error")
        assert (out / name / "kernels.tar.gz").exists() and not (out / name / "kernels").exists()
        with tarfile.open(out / name / "kernels.tar.gz") as tar:  # the cubin TVM handed the driver, whole
            cubin = tmp_path / f"{spec['op']}.cubin"
            cubin.write_bytes(tar.extractfile(f"kernels/{cand['launch']['cubin']}").read())
        elf = subprocess.run(["readelf", "-hlS", str(cubin)], capture_output=True, text=True)
        assert elf.returncode == 0 and "NVIDIA CUDA" in elf.stdout, elf.stderr
        assert "Error" not in elf.stderr and "past end" not in elf.stderr, elf.stderr  # (NVIDIA's sections warn)
    for script in ("check.py", "gpu_worker.py", "cuda_launcher.py", "record_launches.py", "device_env.py",
                   "autotune_runtime.py", "lib/libtvm_runtime_cuda.so"):
        assert (out / script).exists(), script
    assert {w.name.split("-")[0] for w in (out / "wheels").iterdir()} == {"apache_tvm_ffi", "typing_extensions"}
    assert summary["bytes"] < gpu_check.SIZE_LIMIT


def test_configs_come_default_then_hand_picked_then_sampled_per_path():
    from autotune.task import make_task
    from search_spaces import InvalidConfig

    task = make_task("qmatmul", "cuda:sm_90", shape=gpu_check.SHAPES["qmatmul"][0])
    configs = gpu_check.choose_configs(task, 40, seed=0)
    space = task.space
    assert configs[0] == space.default() and len(set(configs)) == len(configs) == 40
    valid = []
    for override in gpu_check._MATMUL_PICKS:  # those of the picks this shape's space holds, in their order
        try:
            cfg = space.make({**configs[0].to_json(), **override})
        except InvalidConfig:
            continue
        valid += [cfg] if cfg not in valid + configs[:1] else []
    assert configs[1:1 + len(valid)] == valid
    paths = [space.path_of(c)[0] for c in valid]
    assert paths[0] == "mma" and paths == sorted(paths, key=("mma", "dp4a").index)  # tensor cores first
    assert {space.path_of(c)[0] for c in configs[-9:]} == {"mma", "dp4a", "plain"}  # sampled per path in turn


def test_a_guided_second_run_skips_what_the_first_measured_and_leads_with_the_models_pick(tmp_path):
    """After an ingest, `prepare --guided` asks the tuner: first what the model ranks fastest among the
    unmeasured (a tensor-core tiling, where the first run found them fastest), then the first run's 3 fastest
    again, to confirm them."""
    from autotune import records
    from autotune.build import Builder
    from autotune.task import make_task

    task = make_task("qmatmul", "cuda:sm_90", shape=gpu_check.SHAPES["qmatmul"][0])
    first = gpu_check.choose_configs(task, 24, seed=0)
    # a first run's records: tensor-core tiles fast, the rest ten times slower
    costs = [(1e-5 if task.space.path_of(c)[0] == "mma" else 1e-4) * (1 + i / 100) for i, c in enumerate(first)]
    records.append(tmp_path / "qmatmul.jsonl", [task.record(c, costs=(t,)) for c, t in zip(first, costs)])
    with Builder(timeout=120) as builder:
        guided = gpu_check.guided_configs(task, 8, tmp_path, seed=0, builder=builder)
    fastest = [c for _, c in sorted(zip(costs, first), key=lambda tc: tc[0])[:3]]
    assert len(guided) == 8 and not set(guided[:5]) & set(first) and guided[5:] == fastest
    assert task.space.path_of(guided[0])[0] == "mma"


@needs_device_python
def test_device_chain_loads_calls_and_launches_every_module(prepared, tmp_path):
    """With the device image's Python and the carried wheel: every module's host code is loaded by tvm_ffi and
    called under the stub driver, and the fallback launcher launches it as TVM did (grid, block, parameters)."""
    root = _copy(prepared, tmp_path)
    proc = gpu_check.record_launches(root, DEVICE_PYTHON, verify=True, timeout=300)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Python 3.12" in proc.stdout and str(root / ".site") not in proc.stdout
    assert f"{len(TINY)} candidates verified, 0 failures" in proc.stdout


LOADERS = """
import json, sys
from pathlib import Path
root, stub_dir, site = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
sys.path.insert(0, str(root))
import cuda_launcher, device_env, gpu_worker, record_launches
stub = record_launches.chain_over_stub(stub_dir, site)
batch = root / sys.argv[4]
cand = device_env.read_json(batch / "batch.json")["candidates"][0]
kernels = device_env.unpack_kernels(batch)
loaders = gpu_worker.Loaders(kernels, ["tvm", "fallback"])
print("tvm", type(loaders.load("tvm", cand)).__name__)
(kernels / "broken.so").write_bytes(b"not a library")
cand = {**cand, "file": "broken.so"}
try:
    loaders.load("tvm", cand)
except Exception as err:
    print("tvm fails", type(err).__name__)
print("fallback", type(loaders.load("fallback", cand)).__name__)
(kernels / "broken.cubin").write_bytes(b"not a cubin")
cand = {**cand, "launch": {**cand["launch"], "cubin": "broken.cubin"}}
try:
    loaders.load("fallback", cand)
except cuda_launcher.CudaError as err:
    print("cubin refused", err.code in cuda_launcher.IMAGE_ERRORS)
local = cuda_launcher.compile_local(kernels, cand["launch"], "sm_90")
stub.reset({})
print("recompiled", type(loaders.load("fallback", cand)).__name__,
      [c["bytes"] for c in stub.calls() if c["call"] == "load"] == [local.stat().st_size])
print("same as TVM's", local.read_bytes() == (kernels / "c000.cubin").read_bytes())
"""


@needs_device_python
def test_a_module_that_will_not_load_falls_back_to_the_launcher_then_to_nvcc(prepared, tmp_path):
    """TVM's library unloadable: the fallback launcher loads the cubin; the cubin refused by the driver: the
    candidate's CUDA C is compiled again by nvcc and that cubin loads (the driver's check is the stub's ELF
    check here)."""
    root = _copy(prepared, tmp_path)
    batch = _batch(root, "qmatmul_requant").relative_to(root)
    proc = subprocess.run([DEVICE_PYTHON, "-c", LOADERS, str(root), gpu_check.stub_driver_dir(),
                           str(tmp_path / "site"), str(batch)], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:6] == ["tvm Function", "tvm fails RuntimeError", "fallback KernelFunction",
                                           "cubin refused True", "recompiled KernelFunction True",
                                           "same as TVM's True"]  # the CUDA C kept is what TVM compiled


def test_the_launcher_checks_shapes_and_widens_parameters():
    import torch

    class Recording:
        spec = {"workspaces": []}

    f = cuda_launcher.KernelFunction(Recording(), [{"shape": [2, 3], "dtype": "float32"}, {"value": 5}])
    with pytest.raises(ValueError, match=r"\(2, 4\).*recorded for \(\(2, 3\), 'float32'\)"):
        f(torch.zeros(2, 4), 5)
    with pytest.raises(ValueError, match="on a GPU"):
        f(torch.zeros(2, 3), 5)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        f(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="argument 0: 6, but the launch was recorded for 5"):
        cuda_launcher.KernelFunction(Recording(), [{"value": 5}])(6)
    pointers, workspaces = [0x1000, 0], [0x9000]
    assert cuda_launcher.param_value({"arg": 0, "offset": 16}, pointers, workspaces) == 0x1010
    assert cuda_launcher.param_value({"workspace": 0}, pointers, workspaces) == 0x9000
    assert cuda_launcher.param_value({"value": 2048}, pointers, workspaces) == 2048


def _check(root, *args, out=None, timeout=300):
    env = {**os.environ, "OUT": str(out or root.parent / "out")}
    return subprocess.run([sys.executable, str(root / "check.py"), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("args, message", [
    (["--timeout-s", "21"], "--timeout-s: must be in (0, 20]"),
    (["--budget-s", "0"], "--budget-s: must be positive"),
    (["--ops", "qmatmul,nope"], "--ops: nope not prepared here"),
])
def test_check_refuses_bad_arguments(prepared, args, message):
    proc = _check(prepared[0], *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_check_without_a_gpu_says_so_and_stops(prepared, tmp_path):
    root = _copy(prepared, tmp_path)
    proc = _check(root, out=tmp_path / "out")
    assert proc.returncode == 1 and "no GPU to measure on: PyTorch sees no CUDA GPU" in proc.stdout, proc.stdout
    assert (tmp_path / "out" / "gpu_check" / "summary.txt").read_text().startswith("no GPU")


# A stand-in for gpu_worker.py that speaks its protocol (the progress file) without a GPU: each candidate does what
# its `fake` field says, and batch 01 cannot make its task's data.
FAKE_WORKER = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import device_env
args = sys.argv[1:]
if args[0] == "--probe":
    device_env.write_json(Path(args[1]), {"gpu": "Fake H200", "capability": "sm_90", "sms": 132, "l2_bytes": 50 << 20,
                          "torch": "2.13", "torch_cuda": "13.0", "python": "3.12", "copy_bytes_per_s": 4.0e12,
                          "cubin_loads": True})
    sys.exit(0)
batch, progress = Path(args[0]), Path(args[args.index("--progress") + 1])
state = device_env.read_json(progress) if progress.exists() else {"items": {}, "current": None}
save = lambda: device_env.write_json(progress, state)
state["current"] = "setup"
save()
if batch.name.startswith("01-"):
    state.update(setup="RuntimeError: CUDA out of memory", current=None)
    save()
    sys.exit(4)
state.update(setup="ok", current=None, traffic={"bytes": 4.0e6, "ops": 2.0e9, "unit": "GB/s"})
state["items"].setdefault("torch:torch", {"costs": [4e-6] * 5, "hot_costs": [2e-6] * 5, "method": "graph"})
save()
for cand in device_env.read_json(batch / "batch.json")["candidates"]:
    key = f"c{cand['id']}"
    if key in state["items"]:
        continue
    state["current"] = key
    save()
    fake = cand.get("fake", "ok")
    if fake == "hang":
        time.sleep(600)
    if fake == "crash":
        os.abort()
    outcome = {"costs": [2e-6] * 5, "hot_costs": [1e-6] * 5, "method": "graph", "loader": "tvm", "error_kind": None,
               "error": None}
    if fake == "load":
        outcome = {"costs": [], "error_kind": "runtime", "loader": None,
                   "error": "tvm load: RuntimeError: cannot open; fallback load: CudaError: CUDA_ERROR_INVALID_IMAGE"}
    if fake == "cuda-error":
        outcome = {"costs": [], "error_kind": "runtime", "loader": "tvm", "error": "illegal memory access"}
    state["items"][key] = {**outcome, "timestamp": time.time()}
    state["current"] = None
    save()
    if fake == "cuda-error":
        sys.exit(3)
"""
FAKES = ["ok", "hang", "crash", "load", "cuda-error", "ok"]


def _supervised(prepared, tmp_path, *args):
    """The prepared directory with the fake worker, batch 00 holding one candidate per entry of FAKES."""
    root = _copy(prepared, tmp_path)
    (root / "gpu_worker.py").write_text(FAKE_WORKER)
    first = root / json.loads((root / "plan.json").read_text())["batches"][0]
    spec = json.loads((first / "batch.json").read_text())
    spec["candidates"] = [{**spec["candidates"][0], "id": i, "fake": fake} for i, fake in enumerate(FAKES)]
    (first / "batch.json").write_text(json.dumps(spec))
    out = tmp_path / "out"
    return root, out, _check(root, "--timeout-s", "2", *args, out=out)


def test_check_blames_hangs_crashes_and_failed_loads_and_goes_on(prepared, tmp_path):
    root, out, proc = _supervised(prepared, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((out / "gpu_check" / "results.json").read_text())["batches"]
    first = results[0]
    kinds = [(c["error_kind"], (c["error"] or "")[:30]) for c in first["candidates"]]
    assert kinds == [(None, ""), ("timeout", "no result within 2 s (hang?)"),
                     ("crash", "the measuring process died (ex"), ("runtime", "tvm load: RuntimeError: cannot"),
                     ("runtime", "illegal memory access"), (None, "")]
    assert {c["error"] for c in results[1]["candidates"]} == {"setup failed: RuntimeError: CUDA out of memory"}
    assert len(results) == len(TINY)  # the other operators were measured regardless
    written = {p.name for p in (out / "gpu_check").iterdir()}  # the device tool brings back eight files at most
    assert {"check.log", "results.json", "summary.txt"} <= written <= {"check.log", "results.json", "summary.txt",
                                                                       "worker.log"}  # (the real worker's log)
    table = proc.stdout
    assert "correct 2/6 (crash 1, ok 2, runtime 2, timeout 1)" in table
    assert "speed-up 2.00x cold, 2.00x hot" in table and "setup failed: RuntimeError: CUDA out of memory" in table
    assert "roof: 2.00 TB/s moved = 50% of this run's copy (4.00 TB/s), 42% of 4.8 TB/s (PyTorch 1.00)" in table
    assert "roof: 1000.0 int8 TOPS = 50.5% of the 1979 TOPS tensor-core peak (PyTorch 500.0)" in table
    assert (out / "gpu_check" / "summary.txt").read_text().startswith("Fake H200")


def test_check_out_of_time_measures_nothing_and_says_so(prepared, tmp_path):
    root, out, proc = _supervised(prepared, tmp_path, "--budget-s", "5")  # under the report's reserve
    assert proc.returncode == 1
    for res in json.loads((out / "gpu_check" / "results.json").read_text())["batches"]:
        assert {c["error"] for c in res["candidates"]} == {"not measured: the time budget ran out"}


def test_ingest_appends_records_once_with_the_template_version_and_features(prepared, tmp_path):
    root, out, proc = _supervised(prepared, tmp_path)
    assert proc.returncode == 0, proc.stderr
    logs = tmp_path / "logs"
    added = gpu_check.ingest(out / "gpu_check", logs, prepared=root, say=lambda m: None)
    assert gpu_check.ingest(out / "gpu_check" / "results.json", logs, prepared=root, say=lambda m: None) == {
        op: 0 for op in added}  # ingesting again adds nothing
    first = json.loads((root / json.loads((root / "plan.json").read_text())["batches"][0] / "batch.json").read_text())
    recs = list(records.load(logs / f"{first['op']}.jsonl"))
    assert [r.error_kind for r in recs] == [None, "timeout", "crash", "runtime", "runtime", None]
    assert all(r.template_version == records.current_version(r.op, r.device) for r in recs)
    assert all(r.device == "cuda:sm_90" for r in recs) and recs[0].features  # candidate 0's, from prepare
    best = records.best(records.current(recs), first["op"], first["workload_key"], "cuda:sm_90")
    assert best is not None and best.latency == 2e-6
    assert not (logs / "batched_embedding_bag.jsonl").exists() or all(  # a failed setup measured nothing
        r.error_kind != "harness" for r in records.load(logs / "batched_embedding_bag.jsonl"))
