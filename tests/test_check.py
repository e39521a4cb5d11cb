"""`autotune check` and `autotune.testing.assert_package_matches`: a good package passes; a swapped kernel file, a
hand-edited manifest, a swap with both hashes recomputed, a crash and a hang each fail, naming the kernel.

One package of two tiny embedding-bag kernels (default configs), the same shapes in sum and mean mode, so a file
swapped between them loads and runs and only the numbers tell.
"""

import json
import re
import shutil
import sys

import pytest

from autotune import check as check_mod
from autotune.check import check
from autotune.cli import main
from autotune.package import entry_digest, export, file_sha256, read_manifest, write_manifest
from autotune.task import make_task
from autotune.testing import assert_package_matches

KERNELS = [dict(rows=50, dim=8, batch=8, pooling=(0, 5)), dict(rows=50, dim=8, batch=8, pooling=(0, 5), mode="mean")]
# a check child whose op returns the kernel's output off by 3e-4 of each output's terms (sum |x_i y_i|)
OFF_BY_A_LITTLE = """
import sys
import autotune.check as check
from search_spaces.interaction.workload import dot_interaction

real = check._run_cases

def off_by_a_little(template, binding, workload, op, *rest):
    def op_off(x, ly, **kwargs):
        return op(x, ly, **kwargs) + 3e-4 * dot_interaction(x.abs(), ly.abs(), kwargs["self_interaction"])
    return real(template, binding, workload, op_off, *rest)

check._run_cases = off_by_a_little
sys.exit(check._child_main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def package(tmp_path_factory, cpu_builder):
    out = tmp_path_factory.mktemp("pkg")
    tasks = [make_task("embedding_bag", "cpu", **fields) for fields in KERNELS]
    export([t.record(t.space.default(), costs=(1e-5,)) for t in tasks], out, builder=cpu_builder)
    return out


@pytest.fixture(scope="module")
def interaction_package(tmp_path_factory, cpu_builder):
    out = tmp_path_factory.mktemp("interaction")
    task = make_task("interaction", "cpu", batch=16, tables=8, dim=32)
    export([task.record(task.space.default(), costs=(1e-5,))], out, builder=cpu_builder)
    return out


@pytest.fixture()
def copy(package, tmp_path):
    """A copy of the package to tamper with."""
    shutil.copytree(package, tmp_path / "pkg", symlinks=True)
    return tmp_path / "pkg"


def _swap_files(pkg):
    a, b = (pkg / e["file"] for e in read_manifest(pkg)["kernels"])
    tmp = a.with_suffix(".tmp")
    a.rename(tmp), b.rename(a), tmp.rename(b)


def _rehash(pkg):
    """What a careful forger does: recompute both integrity fields of every entry."""
    manifest = read_manifest(pkg)
    for e in manifest["kernels"]:
        e["sha256"] = file_sha256(pkg / e["file"])
        e["entry_digest"] = entry_digest(e)
    write_manifest(pkg, manifest)


def test_export_writes_integrity_fields_that_match_the_files(package):
    for e in read_manifest(package)["kernels"]:
        assert e["sha256"] == file_sha256(package / e["file"]) and e["entry_digest"] == entry_digest(e)


def test_a_good_package_passes_through_the_torch_op(package, capsys):
    assert main(["check", str(package), "--cases", "3", "--seed", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["PASS", "PASS", "ok:"], lines
    counted = [int(re.search(r"(\d+)/\1 cases passed", line).group(1)) for line in lines[:2]]
    results = assert_package_matches(package, cases=1, seed=0)
    assert [r.status for r in results] == ["passed", "passed"]
    assert [r.cases + 2 for r in results] == counted  # --cases scales the random cases
    for r in results:
        assert r.passed == r.cases > 1 and 0 < r.kernel_calls <= r.cases and 0 <= r.worst_ratio <= 1


def test_an_interaction_kernel_passes_cases_that_cancel_and_one_off_by_a_little_of_the_terms_fails(
        interaction_package, monkeypatch):
    """Judged against float64 within a bound scaled by the terms (`runtime.judge`): the kernel passes every case,
    large values and cancelling dot products among them, and so does PyTorch's own output; the same kernel off
    by 3e-4 of its terms fails, and the failure names the kernel's, float64 and PyTorch's values and the bound."""
    (good,) = check(interaction_package, cases=1, seed=3).results
    assert good.status == "passed" and good.passed == good.cases == 7 and good.reference == "float64"
    assert good.worst_ratio <= 1 and good.pytorch_worst_ratio <= 1 and good.worst_error > 0
    real = check_mod._child_command
    monkeypatch.setattr(check_mod, "_child_command",
                        lambda *a: [sys.executable, "-c", OFF_BY_A_LITTLE, *real(*a)[3:]])
    (off,) = check(interaction_package, cases=1, seed=3).results
    assert off.status == "failed" and off.worst_ratio > 1, off.failure
    assert re.search(r"kernel \S+, float64 \S+, PyTorch \S+; bound \S+ = atol \S+ \+ rtol \S+ x magnitude",
                     off.failure), off.failure


def test_swapped_kernel_files_fail_naming_the_kernel(copy, capsys):
    _swap_files(copy)
    assert main(["check", str(copy), "--cases", "1", "--seed", "0"]) == 1
    out = capsys.readouterr().out
    first = read_manifest(copy)["kernels"][0]["file"]
    assert "FAILED: embedding_bag" in out and first in out.splitlines()[-1]
    assert [line.startswith("FAIL ") and "kernel file differs from the one exported" in line
            for line in out.splitlines()[:2]] == [True, True]


def test_a_hand_edited_manifest_fails(copy, capsys):
    manifest = read_manifest(copy)
    for e in manifest["kernels"]:
        e["workload"]["batch"] = 16
    write_manifest(copy, manifest)
    with pytest.raises(AssertionError, match="manifest entry edited by hand") as err:
        assert_package_matches(copy, cases=1, seed=0)
    assert all(e["file"] in str(err.value) for e in manifest["kernels"])
    del manifest["kernels"][0]["sha256"]  # an entry stripped of its fields does not pass either
    write_manifest(copy, manifest)
    assert "no integrity fields" in check(copy, cases=1, seed=0).results[0].failure


def test_a_swap_with_recomputed_hashes_fails_by_numerics(copy, capsys):
    _swap_files(copy)
    _rehash(copy)
    assert main(["check", str(copy), "--cases", "2", "--json", "--seed", "0"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["failed"] == 2
    first = report["first_failure"]
    assert first["file"] == read_manifest(copy)["kernels"][0]["file"]
    assert first["why"].startswith("case ") and "error" in first["why"] and "PyTorch" in first["why"]


def test_kernels_built_by_other_template_code_fail_with_what_to_do(copy):
    manifest = read_manifest(copy)
    manifest["kernels"][0]["template_version"] = "0ld0ld0ld0ld"
    write_manifest(copy, manifest)
    _rehash(copy)  # an old package is intact: only its template version tells
    first, second = check(copy, cases=1, seed=0).results
    assert first.status == "failed" and "package template_version '0ld0ld0ld0ld'" in first.failure
    assert "Export the package again" in first.failure and f"{copy}:" in first.failure
    assert second.status == "passed"


def test_json_names_the_first_failure_and_every_kernel(copy, capsys):
    _swap_files(copy)
    assert main(["check", str(copy), "--json", "--seed", "7", "--cases", "3"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert {k: report[k] for k in ("seed", "cases", "ok", "passed", "failed", "skipped")} == \
        dict(seed=7, cases=3, ok=False, passed=0, failed=2, skipped=0)
    assert report["first_failure"]["op"] == "embedding_bag"
    assert "kernel file differs" in report["first_failure"]["why"]
    assert [set(k) >= {"file", "op", "workload_key", "device", "status", "cases", "passed", "worst_error",
                       "failure"} for k in report["kernels"]] == [True, True]


def test_a_crashing_or_hanging_kernel_fails_alone(copy, monkeypatch):
    real = check_mod._child_command
    crash = [sys.executable, "-c", "import os, signal; print('AUTOTUNE-CHECK-CASE batch=3', flush=True); "
                                   "os.kill(os.getpid(), signal.SIGSEGV)"]
    monkeypatch.setattr(check_mod, "_child_command", lambda pkg, i, *a: crash if i == 0 else real(pkg, i, *a))
    report = check(copy, cases=1, seed=0)
    assert report.results[0].status == "failed"
    assert report.results[0].failure == "crashed (SIGSEGV) in case batch=3"
    assert report.results[1].status == "passed"  # the other kernel still ran, in its own child
    hang = check_mod._isolated([sys.executable, "-c", "import time; print('AUTOTUNE-CHECK-CASE empty bags', "
                                                      "flush=True); time.sleep(60)"], timeout=2)
    assert hang["failure"].startswith("timed out after 2 s")  # (its case too, unless starting it took 2 s)
    # the case a hang is named by, from the output it left (bytes, as subprocess.run's timeout hands them over)
    def times_out(cmd, **kw):
        raise check_mod.subprocess.TimeoutExpired(cmd, kw["timeout"], output=b"AUTOTUNE-CHECK-CASE empty bags\n")

    monkeypatch.setattr(check_mod.subprocess, "run", times_out)
    hang = check_mod._isolated(["child"], timeout=2)
    assert hang["failure"] == "timed out after 2 s in case empty bags" and hang["cases"] == 1


def test_kernels_this_machine_cannot_run_are_skipped(copy, capsys):
    manifest = read_manifest(copy)
    entry = manifest["kernels"][0]
    entry["device"] = "cpu:not-this-one"
    entry["entry_digest"] = entry_digest(entry)
    write_manifest(copy, {**manifest, "kernels": [entry]})
    assert main(["check", str(copy)]) == 1  # nothing checked proves nothing
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("SKIP embedding_bag on cpu:not-this-one") and "tuned for cpu:not-this-one" in out[0]
    assert out[1].startswith("FAILED: no kernel of")


def test_amx_kernels_are_skipped_where_linux_grants_no_tile_data(copy, monkeypatch):
    """A kernel whose config runs AMX tiles (qmatmul's `intrinsic=amx`) faults on its first tile instruction where
    the machine has none or Linux does not grant the tile data: `load` skips it, saying why."""
    from autotune import runtime
    from autotune.torch import registry

    manifest = read_manifest(copy)
    entry = manifest["kernels"][0]
    entry["config"] = {**entry["config"], "intrinsic": "amx"}  # as a qmatmul AMX kernel's entry reads
    entry["entry_digest"] = entry_digest(entry)
    write_manifest(copy, {**manifest, "kernels": [entry]})
    monkeypatch.setattr(runtime, "amx_allowed", lambda: False)
    with pytest.warns(UserWarning, match="not loaded"):
        pkg = registry.load(copy, cpu="any")
    assert not pkg.kernels and "AMX tiles" in pkg.skipped[0][1]


def test_bad_arguments_are_user_errors(tmp_path, package, capsys):
    assert main(["check", str(tmp_path / "missing")]) == 2
    assert main(["check", str(package), "--cases", "0"]) == 2
    assert capsys.readouterr().err.count("autotune check: error:") == 2
