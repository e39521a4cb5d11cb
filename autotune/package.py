"""Kernel packages: compiled kernels + manifest + TVM's runtime libraries, usable without the TVM compiler.

A package directory holds
    manifest.json          format, TVM version, and one entry per kernel (op, workload, device, config, file,
                           template_version: the template code that built it; `autotune.torch.load` refuses
                           kernels built by other code than its own)
    kernels/*.so           exported TVM libraries (CPU code, or host stubs with embedded cubins)
    lib/                   libtvm_runtime.so (+ libtvm_runtime_cuda.so when a kernel is for a GPU)
    autotune_runtime.py    a copy of `autotune.runtime`: load, check and time kernels with tvm_ffi + torch
    search_spaces/         the templates' pure-Python side (inputs, reference, argument order, validation)
so that a machine with PyTorch and `apache-tvm-ffi` (a few MB) runs the kernels. `autotune export` writes one
from logs; the offline runner writes one per candidate batch, with `measure.py` to time it there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

import search_spaces

from . import runtime

FORMAT = 1
MANIFEST = "manifest.json"


def tvm_lib_dir() -> str:
    import tvm

    return os.path.join(os.path.dirname(tvm.__file__), "lib")


def write_support_files(out: Path, ops: Iterable[str], gpu: bool) -> None:
    """The runtime libraries, the runtime module and the templates a package's kernels need."""
    (out / "lib").mkdir(parents=True, exist_ok=True)
    for name in runtime.RUNTIME_LIBS[: 2 if gpu else 1]:
        shutil.copy2(os.path.join(tvm_lib_dir(), name), out / "lib" / name)
    if gpu and (cudart := _cudart()) is not None:
        # TVM's CUDA runtime links the CUDA runtime of the toolkit it was built with; the device may have
        # another (or only PyTorch's). The runtime is redistributable: it travels with the kernels.
        shutil.copy2(cudart, out / "lib" / os.path.basename(cudart))
    shutil.copy2(runtime.__file__, out / "autotune_runtime.py")
    src = Path(search_spaces.__file__).parent
    shutil.rmtree(out / "search_spaces", ignore_errors=True)
    shutil.copytree(src, out / "search_spaces", ignore=shutil.ignore_patterns("__pycache__"))
    for op in ops:  # an out-of-tree template (a dotted module path) travels as its file
        if "." in op:
            module_file = Path(search_spaces.get(op).__file__)  # type: ignore[arg-type]
            parts = op.split(".")
            dest = out.joinpath(*parts[:-1])
            dest.mkdir(parents=True, exist_ok=True)
            for i in range(1, len(parts)):
                out.joinpath(*parts[:i], "__init__.py").touch()
            shutil.copy2(module_file, dest / f"{parts[-1]}.py")


def _cudart() -> str | None:
    """The libcudart that libtvm_runtime_cuda.so names (libcudart.so.13 for TVM 0.27's wheel), if installed."""
    import subprocess

    needed = subprocess.run(["readelf", "-d", os.path.join(tvm_lib_dir(), runtime.RUNTIME_LIBS[1])],
                            capture_output=True, text=True).stdout
    name = next((w.strip("[]") for w in needed.split() if w.startswith("[libcudart")), None)
    if name is None:
        return None
    for d in (os.environ.get("CUDA_HOME", "/usr/local/cuda"), "/usr/local/cuda"):
        for sub in ("lib64", "lib"):
            if os.path.exists(path := os.path.join(d, sub, name)):
                return path
    return None


def file_sha256(path: str | Path) -> str:
    """The hex sha256 of a file: a manifest entry records its kernel's, so `autotune check` sees a swapped file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def entry_digest(entry: dict[str, Any]) -> str:
    """A digest of a manifest entry's own fields (all but `entry_digest`), so a hand edit shows."""
    fields = {k: v for k, v in entry.items() if k != "entry_digest"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Atomically: a reader never sees half a manifest."""
    fd, tmp = tempfile.mkstemp(dir=out, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    os.replace(tmp, out / MANIFEST)


def read_manifest(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    p = p / MANIFEST if p.is_dir() else p
    if not p.exists():
        raise FileNotFoundError(f"no kernel package at {path} ({MANIFEST} missing)")
    try:
        manifest = json.loads(p.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{p} is not valid JSON: {err}") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{p}: package format {manifest.get('format')!r}, this version reads {FORMAT}")
    return manifest


def _built_here(out: Path, tvm_version: str) -> dict[str, dict[str, Any]]:
    """The kernel entries (by file) of the package already at `out`, where this TVM built it ({} otherwise)."""
    try:
        manifest = read_manifest(out)
    except (FileNotFoundError, ValueError):
        return {}
    if manifest.get("tvm_version") != tvm_version:
        return {}
    return {e["file"]: e for e in manifest.get("kernels", []) if isinstance(e, dict) and isinstance(e.get("file"), str)}


def _same_build(entry: dict[str, Any] | None, lib: Path, target: str) -> bool:
    """Whether `lib`, named by what it holds (op, workload, device, config, template version), is the kernel an
    earlier export built for `target` and listed, unaltered: then exporting again (tune_model exports after
    each batch of new tasks) need not build it again."""
    return (entry is not None and entry.get("target") == target and lib.is_file()
            and entry.get("sha256") == file_sha256(lib))


def export(records: Iterable[Any], out: str | Path, builder: Any = None,
           speedups: dict[tuple[str, str, str], float] | None = None) -> dict[str, Any]:
    """Compile each record's config and write a package; returns the manifest.

    `records` are the best records to ship (one per op, workload and device). `speedups` (by record task:
    op, workload key, device) are the kernels' speed-ups over PyTorch where measured (`autotune export
    --bench`); the manifest holds null for the others.
    """
    import tvm

    from .build import Builder
    from .task import make_task

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; a package is a directory")
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    earlier = _built_here(out, tvm.__version__)
    entries = []
    own = builder is None
    builder = builder or Builder()
    try:
        for rec in records:
            task = make_task(rec.op, rec.device, workload=search_spaces.get(rec.op).Workload.from_json(rec.workload))
            # named by what it is, not by its position: a process that loaded an earlier package at this path
            # would otherwise be handed the old library again by the dynamic loader
            built_by = task.template_version  # this code built the kernel, whatever code the record timed
            ident = hashlib.sha256(json.dumps([rec.op, rec.workload_key, rec.device, rec.config, built_by],
                                              sort_keys=True).encode()).hexdigest()[:16]
            name = f"{rec.op.rsplit('.', 1)[-1]}-{rec.device.replace(':', '_')}-{ident}.so"
            if not _same_build(earlier.get(f"kernels/{name}"), out / "kernels" / name, rec.target):
                (built,) = builder.build(task, [task.space.from_json(rec.config)])
                if built.lib is None:
                    raise RuntimeError(f"{rec.op} {rec.workload_key} on {rec.device}: the logged config no longer "
                                       f"builds: {built.error_kind}: {built.error}")
                shutil.move(built.lib, out / "kernels" / name)
            entries.append({"file": f"kernels/{name}", "op": rec.op, "workload": rec.workload,
                            "workload_key": rec.workload_key, "device": rec.device, "target": rec.target,
                            "config": rec.config, "template_version": built_by,
                            "latency_s": rec.latency, "speedup_vs_torch": (speedups or {}).get(rec.task),
                            "sha256": file_sha256(out / "kernels" / name),
                            **({} if rec.template_version == built_by else  # --include-stale: timed by older code
                               {"record_template_version": rec.template_version})})
    finally:
        if own:
            builder.close()
    for e in entries:  # last, over every field an entry got: `autotune check` tells a hand edit by it
        e["entry_digest"] = entry_digest(e)
    write_support_files(out, {e["op"] for e in entries}, gpu=any(e["device"].startswith("cuda") for e in entries))
    manifest = {"format": FORMAT, "tvm_version": tvm.__version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "kernels": entries}
    write_manifest(out, manifest)
    return manifest

