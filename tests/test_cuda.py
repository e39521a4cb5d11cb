"""CUDA compilation without a GPU: nvcc through TVM, resource reports, and the limit checks."""

import subprocess
import sys

import pytest

from autotune.cuda import KernelUsage, check_usage, parse_usage
from autotune.targets import resolve
from search_spaces import InvalidConfig

PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'main_kernel' for 'sm_90'
ptxas info    : Function properties for main_kernel
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem, 372 bytes cmem[0]
"""


def test_ptxas_report_and_launch_bounds_are_parsed_per_kernel():
    src = 'extern "C" __global__ void __launch_bounds__(256) main_kernel(float* __restrict__ A) {}'
    assert parse_usage(PTXAS, src) == [KernelUsage("main_kernel", 256, 40, 4096, 4)]


@pytest.mark.parametrize("usage, message", [
    (KernelUsage("k", 2048, 16, 0, 0), "threads per block"),
    (KernelUsage("k", 1024, 128, 0, 0), "registers x 1024 threads"),
    (KernelUsage("k", 128, 32, 64 * 1024, 0), "shared memory"),
])
def test_kernels_over_the_device_limits_are_invalid(usage, message):
    with pytest.raises(InvalidConfig, match=message):
        check_usage([usage], resolve("cuda:sm_90").gpu)
    check_usage([KernelUsage("k", 256, 64, 16 * 1024, 0)], resolve("cuda:sm_90").gpu)


SCRIPT = """
import tvm
from tvm import te
from autotune.cuda import compile_gpu
from autotune.targets import resolve
from search_spaces import InvalidConfig

A = te.placeholder((1 << 16,), name="A")
B = te.compute(A.shape, lambda i: A[i] * 2, name="B")
for threads in (128, 2048):
    sch = tvm.s_tir.Schedule(te.create_prim_func([A, B]))
    (i,) = sch.get_loops(sch.get_sblock("B"))
    bx, tx = sch.split(i, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    try:
        exe, usage = compile_gpu(sch.mod, resolve("cuda:sm_80"))
        exe.export_library("LIB")
        cubin_inside = b".nv.info" in open("LIB", "rb").read()  # a cubin section, not CUDA source to JIT
        print(threads, "ok", usage[0].threads, usage[0].registers, cubin_inside)
    except InvalidConfig as err:
        print(threads, "invalid", "GPU verification" in str(err))
"""


def test_compiles_to_a_cubin_with_nvcc_and_rejects_a_block_too_large(tmp_path):
    from autotune.cuda import prepare_build_environment

    prepare_build_environment()  # the child inherits the (stub) driver path
    script = SCRIPT.replace("LIB", str(tmp_path / "k.so"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split("\n")
    assert lines[0].split()[:3] == ["128", "ok", "128"] and lines[0].endswith("True")
    assert lines[1] == "2048 invalid True"
