"""The GPU check's directory, and the environment its device-side scripts run in: no TVM, no autotune.

`benchmarks/gpu_check.py prepare DIR` writes DIR, which is carried to a GPU machine as it is:

    check.py, gpu_worker.py, cuda_launcher.py, record_launches.py, device_env.py   (benchmarks/gpu_device/)
    plan.json                    the device, its roofs and the batches, in the order they are measured
    batches/NN-<op>/batch.json   one task: its workload, the fields of its records, and per candidate the config
                                 and how TVM's host code launches it (`launch`, recorded under the stub driver)
    batches/NN-<op>/kernels.tar.gz   cNNN.so (TVM's library), cNNN.cubin and cNNN.cu of every candidate
    lib/                         TVM's runtime libraries and the CUDA runtime they link
    wheels/                      apache-tvm-ffi and typing_extensions for the device image's Python
    autotune_runtime.py, search_spaces/   the TVM-free measuring core and the templates (autotune.package)
    features.json.gz             each candidate's program features, for ingest (not used on the device)

and, once check.py ran there, .site/ (the wheels unpacked) and .work/ (the workers' progress: a second run
resumes from it).

This module imports nothing but the standard library, so every script can call it first.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

PLAN, BATCH, ARCHIVE, KERNELS, WHEELS = "plan.json", "batch.json", "kernels.tar.gz", "kernels", "wheels"
STUB_LOG = "GPU_CHECK_STUB_LOG"  # where the stub driver (stub_cuda.c) writes the calls it records
TVM_FFI_VERSION = "0.1.14.post1"  # the version TVM's runtime libraries in lib/ were built against


def write_json(path: Path, obj: Any) -> None:
    """Atomically: a reader (the supervisor, a copy back) never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the file from other users of a shared directory
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def batches(root: Path) -> list[Path]:
    """The batch directories, in the order the plan measures them."""
    return [root / name for name in read_json(root / PLAN)["batches"]]


def unpack_wheels(root: Path, site: Path) -> Path:
    """The carried wheels (apache-tvm-ffi, typing_extensions) unpacked into `site` (a wheel is a zip of what pip
    would install; no pip, no network) and put first on this process's path and on its children's. Only wheels
    for this Python: under another, nothing is unpacked and its own tvm_ffi is used."""
    every = sorted((root / WHEELS).glob("*.whl"))
    if not every:
        raise FileNotFoundError(f"no wheels in {root / WHEELS}: prepare carries apache-tvm-ffi=={TVM_FFI_VERSION}")
    tag = f"-cp{sys.version_info.major}{sys.version_info.minor}-"
    wheels = [w for w in every if tag in w.name or "-py3-none-any" in w.name]
    if not any(w.name.startswith("apache_tvm_ffi") for w in wheels):  # another Python than the device image's:
        return site  # its own tvm_ffi is used (prepare on a machine without that Python records with its own)
    stamp = site / ".unpacked"
    names = "\n".join(w.name for w in wheels)
    if not stamp.exists() or stamp.read_text() != names:
        site.mkdir(parents=True, exist_ok=True)
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as z:
                z.extractall(site)
        stamp.write_text(names)
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), str(root),
                                                             os.environ.get("PYTHONPATH")]))
    return site


def unpack_kernels(batch: Path) -> Path:
    """The batch's kernels directory, unpacked from its archive once (the archive stays: DIR can be carried
    again)."""
    kernels = batch / KERNELS
    archive = batch / ARCHIVE
    if archive.exists() and not (kernels / ".unpacked").exists():
        with tarfile.open(archive) as tar:
            tar.extractall(batch, filter="data")
        (kernels / ".unpacked").touch()
    return kernels


def pack_kernels(batch: Path) -> None:
    """The batch's kernels directory into one gzip archive, then removed. Not xz, though it packs a task's
    libraries (which differ little) 7x smaller: Python builds without lzma exist, and every one has zlib."""
    import shutil

    kernels = batch / KERNELS
    with tarfile.open(batch / ARCHIVE, "w:gz", compresslevel=9) as tar:
        tar.add(kernels, arcname=KERNELS)
    shutil.rmtree(kernels)


def load_stub_driver(stub_dir: str) -> ctypes.CDLL:
    """The stub CUDA driver and runtime (stub_cuda.c, built by the host) loaded before anything asks for
    libcuda.so.1 or libcudart.so.13: their sonames then resolve to them. Only for recording and tests."""
    driver = ctypes.CDLL(os.path.join(stub_dir, "libcuda.so.1"), ctypes.RTLD_GLOBAL)
    ctypes.CDLL(os.path.join(stub_dir, "libcudart.so.13"), ctypes.RTLD_GLOBAL)
    return driver
