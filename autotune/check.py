"""`autotune check PACKAGE`: does each kernel of an exported package still compute what PyTorch computes, here?

The regression test a user runs in CI. Per kernel of the package that this machine can run (the device rules of
`autotune.torch.load`: CPU kernels of this CPU model, CUDA kernels of a GPU PyTorch sees; the others are listed
as skipped):
- integrity first: the kernel file's sha256 and the digest of its manifest entry, both written at export, must
  still match (a swapped file or a hand-edited entry fails here, with a clear line);
- then numerics, in a child process per kernel (a broken kernel may segfault or hang: that kernel fails, named,
  and the others still run): fresh random inputs at several batch sizes and the operator's edge cases (the
  template's `TorchBinding.cases`), called through `torch.ops.autotune.<op>` with only this kernel loaded,
  checking that the call ran the kernel rather than PyTorch's fallback, and judged by the one rule of
  `runtime.judge`: against PyTorch's implementation within the template's tolerance or, for a template whose
  REFERENCE_PRECISION is float64, against that implementation run in float64, within a bound scaled by the
  magnitude of the terms summed (PyTorch's own output is judged too, and reported). So a kernel swapped for
  another workload's, hashes recomputed, still fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from search_spaces.template import Route

from .package import MANIFEST, entry_digest, file_sha256, read_manifest

__all__ = ["CheckReport", "KernelResult", "check", "DEFAULT_CASES", "DEFAULT_TIMEOUT_S"]

DEFAULT_CASES = 8  # random cases per kernel (the operator's edge cases come on top)
DEFAULT_TIMEOUT_S = 300.0  # per kernel, all its cases: past it the kernel is taken to hang
_REFERENCE = {"native": "PyTorch", "float64": "float64"}  # by the template's REFERENCE_PRECISION
# the child's lines: a case starts, a case passed, its result (a crash leaves the first two behind)
_CASE, _PASS, _RESULT = "AUTOTUNE-CHECK-CASE ", "AUTOTUNE-CHECK-PASS", "AUTOTUNE-CHECK-RESULT "


@dataclass
class KernelResult:
    """One manifest entry's verdict: "passed", "failed" (with the first failing case and why) or "skipped"."""

    file: str
    op: str
    workload_key: str
    device: str
    status: str = "passed"
    cases: int = 0  # cases run
    passed: int = 0
    kernel_calls: int = 0  # cases the kernel served (the others PyTorch serves by design, e.g. an empty batch)
    reference: str | None = None  # what outputs are judged against: "float64" or "PyTorch" (runtime.judge)
    worst_error: float | None = None  # largest |kernel - reference| over all cases
    worst_ratio: float | None = None  # largest error / its bound: <= 1 passes
    pytorch_worst_error: float | None = None  # the same two for PyTorch's own output (against float64; else 0)
    pytorch_worst_ratio: float | None = None
    failure: str | None = None  # the first failing case (or integrity check) and why
    skipped: str | None = None  # why this machine cannot run it

    def line(self) -> str:
        head = f"{self.op} on {self.device} {self.workload_key} ({self.file})"
        if self.status == "skipped":
            return f"SKIP {head}: {self.skipped}"
        counts = f"{self.passed}/{self.cases} cases passed ({self.kernel_calls} through the kernel)"
        worst = "" if self.worst_error is None else (
            f", worst error {self.worst_error:.3g} against {self.reference} ({self.worst_ratio:.2g} of the bound"
            + (f"; PyTorch's own {self.pytorch_worst_error:.3g}, {self.pytorch_worst_ratio:.2g} of the bound"
               if self.reference == "float64" else "") + ")")
        if self.status == "passed":
            return f"PASS {head}: {counts}{worst}"
        return f"FAIL {head}: {self.failure}" + (f" [{counts}{worst}]" if self.cases else "")


@dataclass
class CheckReport:
    package: str
    seed: int  # `--seed` reproduces the run's random cases
    cases: int
    results: list[KernelResult] = field(default_factory=list)

    @property
    def failed(self) -> list[KernelResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def ok(self) -> bool:
        """No kernel failed and at least one was checked (a check that checked nothing proves nothing)."""
        return not self.failed and any(r.status == "passed" for r in self.results)

    def verdict(self) -> str:
        n = {s: sum(r.status == s for r in self.results) for s in ("passed", "failed", "skipped")}
        counts = f"{n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped (seed {self.seed})"
        if self.failed:
            first = self.failed[0]
            return f"FAILED: {first.op} {first.workload_key} ({first.file}): {first.failure}; {counts}"
        if not self.ok:
            return f"FAILED: no kernel of {self.package} runs on this machine; {counts}"
        return f"ok: {counts}"

    def format(self) -> str:
        return "\n".join([r.line() for r in self.results] + [self.verdict()])

    def to_json(self) -> dict[str, Any]:
        first = self.failed[0] if self.failed else None
        return {"package": self.package, "seed": self.seed, "cases": self.cases, "ok": self.ok,
                "passed": sum(r.status == "passed" for r in self.results), "failed": len(self.failed),
                "skipped": sum(r.status == "skipped" for r in self.results),
                "first_failure": None if first is None else {"file": first.file, "op": first.op,
                                                             "workload_key": first.workload_key,
                                                             "why": first.failure},
                "kernels": [asdict(r) for r in self.results]}


def check(path: str | os.PathLike[str], cases: int = DEFAULT_CASES, seed: int | None = None,
          timeout: float = DEFAULT_TIMEOUT_S) -> CheckReport:
    """Check every kernel of the package at `path` (see the module docstring); never raises for a bad kernel."""
    if cases < 1:
        raise ValueError(f"--cases must be at least 1, got {cases}")
    if timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {timeout}")
    pkg = Path(path)
    manifest = read_manifest(pkg)
    report = CheckReport(str(pkg), secrets.randbelow(2**31) if seed is None else seed, cases)
    cpu: str | None = None
    for index, entry in enumerate(manifest.get("kernels", [])):
        result = KernelResult(str(entry.get("file")), str(entry.get("op")), str(entry.get("workload_key")),
                              str(entry.get("device")))
        why = integrity_error(pkg, entry)
        if why is not None:
            result.status, result.failure = "failed", why
        else:
            if cpu is None and result.device.startswith("cpu"):
                cpu = _host_cpu()
            cmd = _child_command(pkg, index, cases, report.seed, cpu or "any")
            _merge(result, _isolated(cmd, timeout))
        report.results.append(result)
    return report


def integrity_error(pkg: Path, entry: dict[str, Any]) -> str | None:
    """Why the entry or its kernel file is not what `export` wrote, or None."""
    if "sha256" not in entry or "entry_digest" not in entry:
        return ("manifest entry has no integrity fields (exported by an older autotune, or edited by hand): "
                "export the package again")
    if entry_digest(entry) != entry["entry_digest"]:
        return "manifest entry edited by hand (its fields no longer match the digest written at export)"
    file = (pkg / str(entry.get("file"))).resolve()
    if not file.is_relative_to(pkg.resolve()):
        return f"kernel file {entry.get('file')} lies outside the package"
    if not file.is_file():
        return f"kernel file {entry.get('file')} is missing"
    if file_sha256(file) != entry["sha256"]:
        return "kernel file differs from the one exported (sha256 mismatch)"
    return None


def _host_cpu() -> str:
    """This machine's CPU for the children's `load(cpu=...)`, found once here (it imports TVM) rather than in
    each child; "any" where TVM cannot tell, as `load` does then."""
    from .torch.registry import host_cpu

    return host_cpu() or "any"


def _child_command(pkg: Path, index: int, cases: int, seed: int, cpu: str) -> list[str]:
    return [sys.executable, "-m", "autotune.check", "--child", str(pkg), str(index), str(cases), str(seed), cpu]


def _isolated(cmd: Sequence[str], timeout: float) -> dict[str, Any]:
    """Run a child and read its result line; a crash, a hang or no result is a failure naming the last case."""
    root = str(Path(__file__).resolve().parent.parent)  # the child imports this autotune and these templates
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env)
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return {"failure": f"timed out after {timeout:g} s{_in_case(out)}", **_progress(out)}
    results = [line[len(_RESULT):] for line in out.splitlines() if line.startswith(_RESULT)]
    if rc == 0 and results:
        return json.loads(results[-1])
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
        why = f"crashed ({name}){_in_case(out)}"
    else:
        tail = err.strip().splitlines()[-1][:400] if err.strip() else "no output"
        why = f"child exited with status {rc}{_in_case(out)}: {tail}"
    return {"failure": why, **_progress(out)}


def _in_case(out: str) -> str:
    names = [line[len(_CASE):] for line in out.splitlines() if line.startswith(_CASE)]
    return f" in case {names[-1]}" if names else ""


def _progress(out: str) -> dict[str, Any]:
    """The cases a crashed child got through (it printed each before running it)."""
    lines = out.splitlines()
    return {"cases": sum(line.startswith(_CASE) for line in lines), "passed": lines.count(_PASS)}


def _merge(result: KernelResult, child: dict[str, Any]) -> None:
    for key, value in child.items():
        setattr(result, key, value)
    if result.skipped is not None:
        result.status = "skipped"
    elif result.failure is not None:
        result.status = "failed"


# ---- the child: one kernel, its cases, through the torch op ----------------------------------------------
def _only_entry(pkg: Path, manifest: dict[str, Any], entry: dict[str, Any], into: Path) -> Path:
    """A package view holding just `entry` (its files linked, not copied), so only that kernel is loaded."""
    for item in pkg.iterdir():
        if item.name != MANIFEST:
            (into / item.name).symlink_to(item.resolve(), target_is_directory=item.is_dir())
    (into / MANIFEST).write_text(json.dumps({**manifest, "kernels": [entry]}))
    return into


def _run_kernel(pkg: Path, index: int, count: int, seed: int, cpu: str) -> dict[str, Any]:
    import torch

    import autotune.torch as at

    manifest = read_manifest(pkg)
    entry = manifest["kernels"][index]
    with tempfile.TemporaryDirectory() as tmp:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # load's "not loaded" warning: the reason is reported instead
            try:
                loaded = at.load(_only_entry(pkg, manifest, entry, Path(tmp)), cpu=cpu)
            except at.StalePackage as err:  # built by other template code: its verdict, with what to do
                return {"failure": str(err).replace(str(tmp), str(pkg))}  # the package, not this view of it
        if not loaded.kernels:
            return {"skipped": loaded.skipped[0][1] if loaded.skipped else "not loaded"}
        (kernel,) = loaded.kernels
        device = _torch_device(kernel.device)
        if isinstance(device, str):
            return {"skipped": device}
        template = kernel.template
        binding = template.torch_binding()
        calls = [0]
        inner = kernel.func

        def counting(*args: Any) -> Any:
            calls[0] += 1
            return inner(*args)

        kernel.func = counting
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            return _run_cases(template, binding, kernel.workload, getattr(torch.ops.autotune, template.NAME),
                              device, calls, count, seed)


def _torch_device(kernel_device: str) -> Any:
    """The torch device the kernel runs on here: the CPU, or a GPU of the kernel's architecture (else why not)."""
    import torch

    from .torch.registry import device_key

    if not kernel_device.startswith("cuda"):
        return torch.device("cpu")
    gpus = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    match = [d for d in gpus if device_key(d) == kernel_device]
    if not match:
        return f"tuned for {kernel_device}, this machine's GPUs are " + (
            ", ".join(sorted({device_key(d) for d in gpus})) or "none")
    return match[0]


def _run_cases(template: Any, binding: Any, workload: Any, op: Any, device: Any, calls: list[int], count: int,
               seed: int) -> dict[str, Any]:
    import torch

    from .runtime import expected_call, judge, reference_precision

    compiled = binding.compiled(workload)
    res: dict[str, Any] = {"cases": 0, "passed": 0, "kernel_calls": 0, "worst_error": 0.0, "worst_ratio": 0.0,
                           "pytorch_worst_error": 0.0, "pytorch_worst_ratio": 0.0, "failure": None,
                           "reference": _REFERENCE[reference_precision(template)]}
    for name, args, kwargs in binding.cases(workload, seed, count):
        args, kwargs = _to(args, device), _to(kwargs, device)
        print(_CASE + name, flush=True)
        res["cases"] += 1
        before = calls[0]
        try:
            out = op(*args, **kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as err:  # the kernel's failure is this case's verdict
            why = f"the op raised {type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err) else ''}"
            res["failure"] = res["failure"] or f"case {name}: {why}"
            continue
        served = calls[0] > before
        res["kernel_calls"] += served
        route = binding.route(*args, **kwargs)  # a Route of size >= 1 must reach the kernel; else PyTorch runs
        why = None
        if isinstance(route, Route) and route.size >= 1 and route.signature != compiled:
            why = f"the case calls {binding.describe(route.signature)}, which this kernel does not serve"
        elif isinstance(route, Route) and route.size >= 1 and not served:
            why = "PyTorch's implementation ran, not the kernel (dispatch did not pick it)"
        if why is None:
            verdict = judge(out, expected_call(template, workload, binding.op, *args, **kwargs))
            why = verdict.why
            res["worst_error"] = max(res["worst_error"], verdict.error)
            res["worst_ratio"] = max(res["worst_ratio"], verdict.ratio)
            res["pytorch_worst_error"] = max(res["pytorch_worst_error"], verdict.pytorch_error)
            res["pytorch_worst_ratio"] = max(res["pytorch_worst_ratio"], verdict.pytorch_ratio)
        if why is None:
            res["passed"] += 1
            print(_PASS, flush=True)
        elif res["failure"] is None:
            res["failure"] = f"case {name}: {why}"
    if res["failure"] is None and res["kernel_calls"] == 0:
        res["failure"] = "no case ran the kernel (PyTorch's implementation served them all)"
    return res


def _to(x: Any, device: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def _child_main(argv: Sequence[str]) -> int:
    pkg, index, count, seed, cpu = argv
    result = _run_kernel(Path(pkg), int(index), int(count), int(seed), cpu)
    print(_RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["--child"]:
        sys.exit("usage: autotune check PACKAGE (this module's own entry point runs one kernel's cases)")
    sys.exit(_child_main(sys.argv[2:]))
