"""autotune's thread-pool defaults: set at `import autotune`, before TVM's pool starts; the user's environment wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from autotune import thread_env as threads
from autotune.torch import threads as torch_threads

SPIN = "TVM_THREAD_POOL_SPIN_COUNT"


def test_apply_sets_only_what_the_environment_lacks() -> None:
    env = {SPIN: "77"}
    assert threads.apply(env) == {name: v for name, v in threads.DEFAULTS.items() if name != SPIN}
    assert env[SPIN] == "77"  # the user's value is kept
    empty: dict[str, str] = {}
    assert threads.apply(empty) == threads.DEFAULTS == empty
    assert empty[SPIN] == "0"  # no spinning: TVM's workers sleep, PyTorch's threads get the cores


def test_off_switch_sets_nothing() -> None:
    env = {threads.OFF: "0"}
    assert threads.apply(env) == {} and env == {threads.OFF: "0"}


CHILD = textwrap.dedent("""
    import importlib.util, json, os
    import autotune.torch as at
    from autotune import runtime
    seen = {name: os.environ.get(name) for name in at.threads.VARIABLES}
    os.environ["TVM_NUM_THREADS"] = "1"  # after start (autotune made it the core count), before the pool starts
    lib = os.path.join(importlib.util.find_spec("tvm").submodule_search_locations[0], "lib")
    runtime.load_runtime(lib)
    import tvm_ffi
    print(json.dumps({"env": seen, "applied": at.threads.applied(), "settings": at.threads.settings(),
                      "pool": tvm_ffi.get_global_func("runtime.NumThreads")()}))
""")


def run_child(code: str = CHILD, **env: str) -> dict:
    """The JSON line `code` prints, run in a fresh interpreter without the thread variables of this one."""
    clean = {k: v for k, v in os.environ.items() if k not in threads.VARIABLES and k != threads.OFF}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_autotune_torch_reads_the_same_defaults() -> None:
    assert torch_threads.apply is threads.apply and torch_threads.DEFAULTS is threads.DEFAULTS


BARE = textwrap.dedent("""
    import json, os, sys
    import autotune
    print(json.dumps({"spin": os.environ.get("TVM_THREAD_POOL_SPIN_COUNT"), "torch": "torch" in sys.modules,
                      "applied": autotune.thread_env.applied()}))
""")


def run_bare(**env: str) -> dict:
    """`import autotune` alone (as the tuner's workers and `autotune.kernel` users do) in a clean environment."""
    return run_child(BARE, **env)


def test_import_autotune_alone_sets_the_spin_count_without_importing_torch() -> None:
    assert run_bare() == {"spin": "0", "torch": False, "applied": {SPIN: "0"}}
    assert run_bare(TVM_THREAD_POOL_SPIN_COUNT="5") == {"spin": "5", "torch": False, "applied": {}}
    assert run_bare(AUTOTUNE_THREAD_DEFAULTS="0") == {"spin": None, "torch": False, "applied": {}}


def test_import_sets_the_defaults_before_tvms_pool_starts() -> None:
    out = run_child()
    assert out["env"][SPIN] == "0" and out["applied"] == {SPIN: "0"}
    assert out["settings"][SPIN] == "0 (autotune default)"
    # TVM reads its variables when its pool starts (first kernel), not when its library loads: setting them at
    # import of autotune.torch is early enough (on a 1-core machine this last check cannot tell)
    assert out["pool"] == 1


def test_the_users_environment_wins_at_import() -> None:
    out = run_child(TVM_THREAD_POOL_SPIN_COUNT="12345")
    assert out["env"][SPIN] == "12345" and SPIN not in out["applied"]
    assert out["settings"][SPIN] == "12345"


# ---- TVM's parallel loops on PyTorch's OpenMP pool (runtime.share_openmp_pool) --------------------------------
POOL_CHILD = textwrap.dedent("""
    import importlib.util, json, os, sys, warnings
    import torch
    from autotune import runtime
    from autotune.task import make_task
    path, shape = sys.argv[1], sys.argv[2]
    runtime.load_runtime(os.path.join(importlib.util.find_spec("tvm").submodule_search_locations[0], "lib"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        func = runtime.load_function(path)
    task = make_task("interaction", "cpu", shape=shape)
    tensors = task.template.inputs(task.workload, 0)
    out = task.bind(task.space.default(), func)(*tensors)
    ok = torch.allclose(out, task.template.reference(task.workload, *tensors), rtol=1e-5, atol=1e-5)
    print(json.dumps({"launcher": runtime.parallel_launcher(path), "ok": ok,
                      "warnings": [str(w.message) for w in caught]}))
""")
POOL_SHAPE = "batch=64,tables=5,dim=16"


def _parallel_library(tmp_path) -> str:
    from autotune.build import compile_module
    from autotune.task import make_task

    task = make_task("interaction", "cpu", shape=POOL_SHAPE)
    assert task.space.default().as_dict()["threading"] == "parallel"
    path = str(tmp_path / "kernel.so")
    compile_module(task, task.space.default()).export_library(path)
    return path


def test_kernels_run_their_parallel_loops_on_pytorchs_openmp_pool_unless_told_not_to(tmp_path) -> None:
    import subprocess as sp

    path = _parallel_library(tmp_path)

    def child(**env: str) -> dict:
        clean = {k: v for k, v in os.environ.items() if k not in threads.VARIABLES and k != "AUTOTUNE_PARALLEL"}
        done = sp.run([sys.executable, "-c", POOL_CHILD, path, POOL_SHAPE], env={**clean, **env},
                      capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    cache = str(tmp_path / "cache")
    assert child(AUTOTUNE_CACHE=cache) == {"launcher": "openmp", "ok": True, "warnings": []}
    assert os.listdir(cache)  # the launcher is compiled once per machine, then reused
    assert child(AUTOTUNE_CACHE=cache, AUTOTUNE_PARALLEL="tvm") == {"launcher": "tvm", "ok": True, "warnings": []}
    # no C compiler: the kernel keeps TVM's pool, with one warning saying so
    out = child(AUTOTUNE_CACHE=str(tmp_path / "empty"), CC="/nonexistent/cc")
    assert out["launcher"] == "tvm" and out["ok"]
    assert len(out["warnings"]) == 1 and "keep TVM's thread pool" in out["warnings"][0]


def test_an_unknown_parallel_pool_is_a_clear_error(monkeypatch) -> None:
    import pytest

    from autotune import runtime

    monkeypatch.setenv("AUTOTUNE_PARALLEL", "gomp")
    with pytest.raises(ValueError, match="AUTOTUNE_PARALLEL must be openmp or tvm, got 'gomp'"):
        runtime.parallel_pool()
    monkeypatch.setenv("AUTOTUNE_PARALLEL", " TVM ")
    assert runtime.parallel_pool() == "tvm"
    monkeypatch.delenv("AUTOTUNE_PARALLEL")
    assert runtime.parallel_pool() == "openmp"
