"""Record how TVM's host code launches every prepared candidate, on a machine without a GPU, and check that the
fallback launcher (cuda_launcher.py) launches it the same way.

    python DIR/record_launches.py --stub STUB_DIR [--site SITE] [--verify] [BATCH_DIR ...]

Runs the device-side chain of the GPU check as far as a machine without a GPU can: the carried wheels
(apache-tvm-ffi) unpacked for this Python, TVM's runtime libraries from DIR/lib over a stub CUDA driver and
runtime (stub_cuda.c, built by the host: every call succeeds and the launches are written down), and each
candidate's library loaded with `tvm_ffi.load_module` and called with stand-in GPU tensors of the recorded
shapes. The stub's record becomes the candidate's `launch` spec in batch.json (kernel names, grid, block,
shared memory, each parameter's source) and its cubin file (the image TVM handed the driver). The fallback
launcher then runs the candidate from that spec and cubin under the same stub, and its launches must equal
TVM's. `--verify` records again and compares with the stored specs and cubins instead of writing them.
Exit status 1 if any library fails to load or the launcher disagrees with TVM. No torch needed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import device_env  # noqa: E402

# DLPack's (type code, bits) of the dtypes kernel arguments have
DLPACK_DTYPES = {"float32": (2, 32), "float64": (2, 64), "float16": (2, 16), "bfloat16": (4, 16), "int8": (0, 8),
                 "int16": (0, 16), "int32": (0, 32), "int64": (0, 64), "uint8": (1, 8), "bool": (6, 8)}
KDL_CUDA = 2
BASE = 0x7F0000000000  # argument i of a call stands at BASE + (i + 1) << 32: far apart, aligned, recognisable
C_SIZES = {"int": 4, "int32_t": 4, "unsigned int": 4, "uint32_t": 4, "float": 4, "int64_t": 8, "long long": 8,
           "uint64_t": 8, "unsigned long long": 8, "double": 8, "short": 2, "int16_t": 2, "half": 2,
           "signed char": 1, "char": 1, "int8_t": 1, "unsigned char": 1, "uint8_t": 1, "bool": 1}
_KERNEL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(([^)]*)\)')


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_KEEP: list[Any] = []  # the stand-in tensors' structs: tvm_ffi holds pointers into them (no deleter frees them)


def stand_in(address: int, shape: list[int], dtype: str) -> Any:
    """A tvm_ffi tensor on GPU 0 at `address` (never dereferenced by the host code: only the stub sees it)."""
    import tvm_ffi

    code, bits = DLPACK_DTYPES[dtype]
    dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
    managed = DLManagedTensor(DLTensor(address, DLDevice(KDL_CUDA, 0), len(shape), DLDataType(code, bits, 1), dims,
                                       None, 0), None, None)
    _KEEP.append((managed, dims))
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype, new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return tvm_ffi.from_dlpack(new_capsule(ctypes.addressof(managed), b"dltensor", None))


def kernel_params(source: str) -> dict[str, list[tuple[bool, int]]]:
    """Each kernel's parameters in the CUDA C: (is a pointer, bytes)."""
    out = {}
    for name, params in _KERNEL.findall(source):
        types = [p.strip().replace("__restrict__", "").rsplit(" ", 1)[0].strip() for p in params.split(",")
                 if p.strip()]
        out[name] = [(t.endswith("*"), 8 if t.endswith("*") else C_SIZES[t]) for t in types]
    return out


def nbytes(arg: dict[str, Any]) -> int:
    n = 1
    for d in arg["shape"]:
        n *= d
    return n * max(1, DLPACK_DTYPES[arg["dtype"]][1] // 8)


class Stub:
    """The stub driver loaded in this process, and its record of the calls since the last `reset`."""

    def __init__(self, stub_dir: str):
        self.log = Path(tempfile.mkstemp(prefix="gpu-check-stub-", suffix=".jsonl")[1])
        os.environ[device_env.STUB_LOG] = str(self.log)
        self.lib = device_env.load_stub_driver(stub_dir)
        # (address, bytes) of every device allocation so far: TVM's workspace pool allocates a page once and
        # hands it out again to later calls, so a call may use memory an earlier call allocated
        self.allocations: list[tuple[int, int]] = []

    def reset(self, params: dict[str, list[tuple[bool, int]]]) -> None:
        self.log.write_text("")
        for name, ps in params.items():
            self.lib.stub_expect_params(name.encode(), len(ps))

    def calls(self) -> list[dict[str, Any]]:
        calls = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        self.allocations += [(int(c["address"], 16), c["bytes"]) for c in calls if c["call"] == "malloc"]
        return calls


def record(func: Any, cand: dict[str, Any], source: str, stub: Stub
           ) -> tuple[dict[str, Any], bytes, list[dict[str, Any]], list[int]]:
    """(launch spec, cubin, the stub's record, the addresses of the workspaces used) of one candidate: its TVM
    `main` called under the stub (ValueError where the calls are not ones the launcher can repeat)."""
    params = kernel_params(source)
    stub.reset(params)
    bases = [BASE + ((i + 1) << 32) if "shape" in a else 0 for i, a in enumerate(cand["args"])]
    func(*[stand_in(b, a["shape"], a["dtype"]) if "shape" in a else a["value"] for b, a in zip(bases, cand["args"])])
    calls = stub.calls()
    loads = [c for c in calls if c["call"] == "load"]
    if len(loads) != 1:
        raise ValueError(f"the host code loaded {len(loads)} CUDA modules (the launcher handles one)")
    cubin = ctypes.string_at(int(loads[0]["address"], 16), loads[0]["bytes"])
    workspaces: list[tuple[int, int]] = []  # the allocations this call's kernels use, in order of first use
    kernels = []
    for c in (c for c in calls if c["call"] == "launch"):
        if c["attributes"]:
            raise ValueError(f"{c['kernel']} is launched with {c['attributes']} launch attributes (clusters?)")
        if not c["known_params"]:
            raise ValueError(f"{c['kernel']} is not a kernel of the candidate's CUDA C")
        values = [int(v, 16) for v in c["params"]]
        kernels.append({"name": c["kernel"], "grid": c["grid"], "block": c["block"], "shared": c["shared"],
                        "params": [_source_of(v, ptr, size, cand["args"], bases, stub.allocations, workspaces,
                                              c["kernel"])
                                   for v, (ptr, size) in zip(values, params[c["kernel"]])]})
    if not kernels:
        raise ValueError("the host code launched no kernel")
    attributes = [{k: c[k] for k in ("kernel", "attribute", "value")} for c in calls if c["call"] == "attribute"]
    return ({"kernels": kernels, "workspaces": [n for _, n in workspaces], "attributes": attributes}, cubin, calls,
            [a for a, _ in workspaces])


def _source_of(value: int, pointer: bool, size: int, args: list[dict[str, Any]], bases: list[int],
               allocations: list[tuple[int, int]], used: list[tuple[int, int]], kernel: str) -> dict[str, int]:
    """Where a parameter's value comes from: an argument's address (+ offset), a workspace's (an allocation of
    TVM's, numbered in `used` by first use), or a constant."""
    if not pointer:
        return {"value": value & ((1 << (8 * size)) - 1)}
    for i, (a, base) in enumerate(zip(args, bases)):
        if "shape" in a and base <= value < base + max(1, nbytes(a)):
            return {"arg": i, "offset": value - base} if value != base else {"arg": i}
    for base, n in allocations:
        if base <= value < base + n:
            if (base, n) not in used:
                used.append((base, n))
            i = used.index((base, n))
            return {"workspace": i} if value == base else {"workspace": i, "offset": value - base}
    raise ValueError(f"{kernel}: a pointer parameter ({value:#x}) that is no argument's or workspace's address")


def replay(spec: dict[str, Any], cubin: bytes, cand: dict[str, Any], params: dict[str, list[tuple[bool, int]]],
           stub: Stub, tvm_calls: list[dict[str, Any]], workspaces: list[int]) -> str | None:
    """How the fallback launcher's launches under the stub differ from TVM's (None: they do not), given the
    addresses of the workspaces TVM used."""
    import cuda_launcher

    stub.reset(params)
    bases = [BASE + ((i + 1) << 32) if "shape" in a else 0 for i, a in enumerate(cand["args"])]
    cuda_launcher.Launcher(spec, cubin, cuda_launcher.Driver(stub.lib)).launch(bases, workspaces, 0)
    mine = [c for c in stub.calls() if c["call"] == "launch"]
    theirs = [c for c in tvm_calls if c["call"] == "launch"]
    if len(mine) != len(theirs):
        return f"{len(mine)} launches, TVM made {len(theirs)}"
    for m, t in zip(mine, theirs):
        for key in ("kernel", "grid", "block", "shared"):
            if m[key] != t[key]:
                return f"{t['kernel']}: {key} {m[key]}, TVM's {t[key]}"
        for i, ((_, size), a, b) in enumerate(zip(params[t["kernel"]], m["params"], t["params"])):
            mask = (1 << (8 * size)) - 1
            if int(a, 16) & mask != int(b, 16) & mask:
                return f"{t['kernel']}: parameter {i} is {int(a, 16) & mask:#x}, TVM passed {int(b, 16) & mask:#x}"
    return None


def record_batch(batch: Path, stub: Stub, verify: bool) -> tuple[int, list[str], list[str]]:
    """(candidates recorded, their notes (no fallback for them), failures) of one batch; batch.json and the
    cubins are updated unless `verify`."""
    import tvm_ffi

    spec = device_env.read_json(batch / device_env.BATCH)
    kernels = device_env.unpack_kernels(batch)
    done, notes, failures = 0, [], []
    for cand in spec["candidates"]:
        name = f"{batch.name}/{cand['file']}"
        try:
            func = tvm_ffi.load_module(str(kernels / cand["file"]))["main"]
        except Exception as err:  # noqa: BLE001 -- the chain is what is tested: report every failure
            failures.append(f"{name}: does not load: {type(err).__name__}: {err}")
            continue
        source = (kernels / cand["source"]).read_text()
        try:
            launch, cubin, tvm_calls, workspaces = record(func, cand, source, stub)
        except Exception as err:  # noqa: BLE001 -- a call the launcher cannot repeat: no fallback, said so
            notes.append(f"{name}: no fallback launch: {type(err).__name__}: {err}")
            cand.pop("launch", None)
            cand["launch_error"] = str(err)
            continue
        cubin_file = cand["file"].removesuffix(".so") + ".cubin"
        launch = {"cubin": cubin_file, "source": cand["source"], **launch}
        why = replay(launch, cubin, cand, kernel_params(source), stub, tvm_calls, workspaces)
        if why is not None:
            failures.append(f"{name}: the fallback launcher disagrees with TVM: {why}")
            continue
        if verify:
            if cand.get("launch") != launch or (kernels / cubin_file).read_bytes() != cubin:
                failures.append(f"{name}: the launch differs from the one recorded at prepare time")
                continue
        else:
            (kernels / cubin_file).write_bytes(cubin)
            cand["launch"] = launch
            cand.pop("launch_error", None)
        done += 1
    if not verify:
        device_env.write_json(batch / device_env.BATCH, spec)
    return done, notes, failures


def chain_over_stub(stub_dir: str, site: Path) -> Stub:
    """The device-side chain in this process, over the stub driver: the carried wheels unpacked into `site`
    (for the device image's Python), the stub loaded, then tvm_ffi and TVM's runtime libraries from DIR/lib
    (their libcuda.so.1 and libcudart.so.13 resolve to the stub's, so the carried CUDA runtime is left out)."""
    device_env.unpack_wheels(HERE, site)
    stub = Stub(stub_dir)
    import tvm_ffi

    ctypes.CDLL(os.path.join(os.path.dirname(tvm_ffi.__file__), "lib", "libtvm_ffi.so"), ctypes.RTLD_GLOBAL)
    for name in ("libtvm_runtime.so", "libtvm_runtime_cuda.so"):
        ctypes.CDLL(str(HERE / "lib" / name), ctypes.RTLD_GLOBAL)
    return stub


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stub", required=True, help="directory of the stub libcuda.so.1 and libcudart.so.13")
    p.add_argument("--site", type=Path, help="where the carried wheels are unpacked (default: a temporary folder)")
    p.add_argument("--verify", action="store_true", help="compare with the recorded specs instead of writing them")
    p.add_argument("batches", nargs="*", type=Path, help="batch directories (default: all of the plan's)")
    args = p.parse_args(argv)
    stub = chain_over_stub(args.stub, args.site or Path(tempfile.mkdtemp(prefix="gpu-check-site-")))
    import tvm_ffi

    print(f"record_launches: Python {sys.version.split()[0]}, tvm_ffi {tvm_ffi.__version__} from "
          f"{Path(tvm_ffi.__file__).parent}", flush=True)
    total, bad = 0, 0
    for batch in args.batches or device_env.batches(HERE):
        done, notes, failures = record_batch(batch, stub, args.verify)
        n = len(device_env.read_json(batch / device_env.BATCH)["candidates"])
        print(f"  {batch.name}: {done}/{n} candidates loaded, called and launched alike by the fallback", flush=True)
        for line in notes + failures:
            print(f"    {line}", flush=True)
        total += done
        bad += len(failures)
    print(f"record_launches: {total} candidates {'verified' if args.verify else 'recorded'}, {bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
