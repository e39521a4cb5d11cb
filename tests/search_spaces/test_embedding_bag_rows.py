"""Reduced-precision tables (search_spaces/embedding_bag/rows.py): fp16, bf16 and FBGEMM's fused int8 rows, in
the embedding-bag and table-batched kernels (CPU numerics, CUDA builds and the CUDA schedule's CPU twin), the
torch op and its modules, and the peers that benchmarks compare them with."""

import random

import pytest
import torch
import torch.nn.functional as F
import tvm

import autotune.torch as at
from autotune.build import compile_module
from autotune.package import export
from autotune.targets import GPUS, gpu_device
from autotune.task import make_task
from conftest import load_counting
from gpu_build import assert_built_within_limits, build_sample
from search_spaces import WorkloadError
from search_spaces import batched_embedding_bag as tbe
from search_spaces import embedding_bag as eb
from search_spaces.embedding_bag import cuda as eb_cuda
from search_spaces.embedding_bag import fbgemm
from search_spaces.embedding_bag.rows import RowFormat, dequantize, quantize, table_dtype
from search_spaces.template import InvalidDtype, InvalidInput

REDUCED = ("float16", "bfloat16", "int8")
SM90 = gpu_device(GPUS["sm_90"])


def run(task, cfg, *tensors):
    args, out = task.kernel_args(cfg, (), tensors)
    compile_module(task, cfg)["main"](*args)
    return out


# ---- the row format ---------------------------------------------------------------------------------------------
def test_int8_rows_are_fbgemms_fused_rows_and_dequantize_as_pytorchs_int8_bag_pools():
    weight = torch.randn(300, 32, generator=torch.Generator().manual_seed(0))
    q = quantize(weight, "int8")
    assert q.dtype == torch.uint8 and q.shape == (300, 40)  # 32 values, then a float32 scale and bias
    assert (dequantize(q, "int8") - weight).abs().max() < (weight.max() - weight.min()) / 255
    idx, off = torch.randint(0, 300, (64,)), torch.arange(0, 64, 8)
    theirs = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(q, idx, off, False, 0, False, None, None, False)
    torch.testing.assert_close(F.embedding_bag(idx, dequantize(q, "int8"), off, mode="sum"), theirs, rtol=1e-5, atol=1e-5)
    assert table_dtype(q) == "int8" and table_dtype(quantize(weight, "bfloat16")) == "bfloat16"
    assert table_dtype(weight.double()) is None


@pytest.mark.parametrize("dtype, dim, row_bytes, lines", [
    ("float32", 64, 256, 4), ("float32", 24, 96, 2), ("int8", 64, 72, 2), ("float16", 64, 128, 2), ("int8", 24, 32, 1)])
def test_a_row_spans_the_cache_lines_its_size_and_alignment_allow(dtype, dim, row_bytes, lines):
    fmt = RowFormat(dtype, dim)
    assert (fmt.row_bytes, fmt.lines_touched) == (row_bytes, lines)
    starts = {(r * row_bytes) % 64 for r in range(64)}
    assert max(-(-(s + row_bytes) // 64) for s in starts) == lines  # what rows of a 64-byte aligned table do


def test_the_dtype_field_is_validated_and_left_out_of_fp32_keys():
    w = eb.Workload.from_shape("rows=100,dim=64,batch=8,pooling=4")
    assert '"dtype"' not in w.key() and eb.Workload.from_json(w.to_json()) == w  # shipped fp32 records keep their key
    q = eb.Workload.from_shape("rows=100,dim=64,batch=8,pooling=4,dtype=int8")
    assert '"dtype":"int8"' in q.key() and eb.Workload.from_json(q.to_json()) == q
    assert q.numeric_features()["row_bytes"] == 72 and w.numeric_features()["row_bytes"] == 256
    with pytest.raises(WorkloadError, match="dtype must be one of"):
        eb.Workload.from_shape("rows=100,dim=64,batch=8,pooling=4,dtype=int4")
    with pytest.raises(WorkloadError, match="dim % 4 == 0"):
        tbe.Workload.from_shape("tables=2,rows=100,dim=30,batch=8,pooling=4,dtype=int8")
    assert '"dtype"' not in tbe.Workload.from_shape("tables=2,rows=100,dim=32,batch=8,pooling=4").key()


# ---- the kernels --------------------------------------------------------------------------------------------
EB_CASES = {"sum": dict(), "mean-pad": dict(mode="mean", padding_idx=3), "max-int32": dict(mode="max", index_dtype="int32"),
            "weighted-last-offset": dict(per_sample_weights=True, include_last_offset=True)}


@pytest.mark.parametrize("dtype", REDUCED)
def test_cpu_kernels_pool_the_tables_float32_values(dtype):
    rng = random.Random(7)
    for case, fields in EB_CASES.items():
        task = make_task("embedding_bag", "cpu", rows=50, dim=24, batch=13, pooling=(0, 7), dtype=dtype, **fields)
        tensors = eb.inputs(task.workload, seed=3)
        assert tensors[0].dtype == getattr(torch, RowFormat(dtype, 24).storage)
        ref = eb.reference(task.workload, *tensors)
        for cfg in (task.space.default(), task.space.sample(rng)):
            torch.testing.assert_close(run(task, cfg, *tensors), ref, rtol=1e-5, atol=1e-5, msg=f"{case} {cfg}")


@pytest.mark.parametrize("dtype", REDUCED)
def test_table_batched_cpu_kernels_pool_the_tables_float32_values(dtype):
    rng = random.Random(3)
    for mode in ("sum", "mean"):
        task = make_task("batched_embedding_bag", "cpu", rows=(50, 7, 30), dim=32, batch=5, pooling=(0, 7),
                         mode=mode, dtype=dtype)
        tensors = tbe.inputs(task.workload, seed=2)
        ref = tbe.reference(task.workload, *tensors)
        for cfg in (task.space.default(), task.space.sample(rng)):
            torch.testing.assert_close(run(task, cfg, *tensors), ref, rtol=1e-5, atol=1e-5, msg=f"{mode} {cfg}")


def test_int8_prefetch_reaches_the_line_of_the_scale_and_bias():
    """A 72-byte int8 row of dim 64 straddles two cache lines; its scale and bias may sit in the second, so the
    space offers prefetching it, and the prefetch stays inside the row."""
    task = make_task("embedding_bag", "cpu", rows=300, dim=64, batch=9, pooling=(1, 9), dtype="int8")
    assert 2 in next(k for k in task.space.knobs if k.name == "prefetch_lines").values
    cfg = task.space.make({**task.space.default().to_json(), "prefetch": 4, "prefetch_lines": 2})
    assert "llvm.prefetch" in eb.lower(task.workload, cfg, task.device.target()).script()
    tensors = eb.inputs(task.workload, seed=1)
    torch.testing.assert_close(run(task, cfg, *tensors), eb.reference(task.workload, *tensors), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fields", [dict(), dict(mode="mean", padding_idx=3), dict(per_sample_weights=True, padding_idx=0)],
                         ids=["sum", "mean-pad", "weighted-pad"])
def test_int8_rows_pooled_into_the_scratch_add_their_bias_once_per_row(fields):
    """Into the scratch, an int8 row's values are scaled per element and its bias added once, into a column of
    its own: groups and remainders of unrolled rows, padded and out-of-range rows (not added) alike."""
    task = make_task("embedding_bag", "cpu", rows=50, dim=32, batch=11, pooling=(0, 9), dtype="int8", **fields)
    w, tensors = task.workload, eb.inputs(task.workload, seed=4)
    for unroll, accumulator in ((4, "local"), (1, "local"), (2, "output")):
        cfg = task.space.make({**task.space.default().to_json(), "unroll": unroll, "accumulator": accumulator})
        script = eb.lower(w, cfg, task.device.target()).script()
        split = accumulator == "local" or w.mode == "mean"
        assert ('"acc_bias"' in script) == split and ('"acc_tail_bias"' in script) == (split and unroll > 1)
        torch.testing.assert_close(run(task, cfg, *tensors), eb.reference(w, *tensors), rtol=1e-5, atol=1e-5,
                                   msg=str(cfg))
    bad = tensors[1].clone()
    bad[[1, -2]] = torch.tensor([50, -1])  # not read, nothing added for them (their bias neither)
    cfg = task.space.make({**task.space.default().to_json(), "unroll": 4, "accumulator": "local"})
    args, out = task.kernel_args(cfg, (), (tensors[0], bad, *tensors[2:]))
    compile_module(task, cfg)["main"](*args)
    kept = bad.clone()
    absent = (bad < 0) | (bad >= 50)
    kept[absent] = 0
    weights = tensors[3].clone() if w.per_sample_weights else torch.ones(bad.numel())
    weights[absent] = 0  # an absent row adds nothing: a weight of 0 on row 0
    expected = F.embedding_bag(kept, dequantize(tensors[0], "int8"), tensors[2], mode="sum", per_sample_weights=weights,
                               padding_idx=w.padding_idx) if w.mode == "sum" else None
    if expected is not None:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_table_batched_int8_rows_in_the_scratch_add_their_bias_once_per_row(mode):
    """The table-batched kernel as embedding_bag's: into the scratch, a row's bias once (a column of its own);
    into the output (sum), per element; a row out of its table adds nothing, its bias neither, and is flagged."""
    task = make_task("batched_embedding_bag", "cpu", rows=(50, 7, 30), dim=32, batch=9, pooling=(0, 9), mode=mode,
                     dtype="int8")
    w, tensors = task.workload, tbe.inputs(task.workload, seed=4)
    accumulators = ("local", "output") if mode == "sum" else ("local",)
    for unroll, accumulator in [(u, a) for u in (4, 1) for a in accumulators]:
        cfg = task.space.make({**task.space.default().to_json(), "unroll": unroll, "accumulator": accumulator})
        script = tbe.lower(w, cfg, task.device.target()).script()
        split = accumulator == "local"
        assert ('"acc_bias"' in script) == split and ('"acc_tail_bias"' in script) == (split and unroll > 1)
        torch.testing.assert_close(run(task, cfg, *tensors), tbe.reference(w, *tensors), rtol=1e-5, atol=1e-5,
                                   msg=str(cfg))
    weight, table_offsets, indices, offsets = tensors  # TBE layout: table-major bags, each table's own rows
    at = int(offsets[w.batch])  # table 1's first index (7 rows)
    assert at < int(offsets[2 * w.batch])
    bad = indices.clone()
    bad[at] = 7
    cfg = task.space.make({**task.space.default().to_json(), "unroll": 4, "accumulator": "local"})
    args, out = task.kernel_args(cfg, (), (weight, table_offsets, bad, offsets))
    compile_module(task, cfg)["main"](*args)
    assert int(args[-1].numpy()[0]) != 0  # flagged
    if mode == "sum":  # the bad row pools nothing: as if its bag lacked it (a mean would count it)
        kept = torch.cat([indices[:at], indices[at + 1:]])
        shifted = torch.where(torch.arange(offsets.numel()) > w.batch, offsets - 1, offsets)
        torch.testing.assert_close(out, tbe.reference(w, weight, table_offsets, kept, shifted), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["sm_90"])
def test_gpu_kernels_of_reduced_tables_build_within_the_device_limits(gpu_builder, arch):
    for dtype in REDUCED:
        for op, fields in (("embedding_bag", dict(rows=100)), ("batched_embedding_bag", dict(rows=(100, 30)))):
            task, built = build_sample(gpu_builder, op, arch, 2, seed=1, dim=64, batch=32, pooling=(0, 9),
                                       dtype=dtype, **fields)
            assert_built_within_limits(task, built)
            assert all(b.error_kind is None for b in built), [(str(b.config), b.error) for b in built if b.error]


@pytest.mark.parametrize("dtype", REDUCED)
def test_gpu_schedule_of_reduced_tables_on_its_cpu_twin(dtype):
    fields = dict(rows=50, dim=64, pooling=(0, 40), mode="mean", dtype=dtype)
    w = eb.Workload(batch=13, **fields)
    space = eb.space(w, SM90.target())
    assert all(RowFormat(dtype, 64).aligned_vector(v) for v in next(k for k in space.knobs if k.name == "gpu_vector").values)
    for cfg in (space.default(), space.sample(random.Random(2))):
        kernel = tvm.compile(eb_cuda.lower_emulation(w, cfg, SM90.target()), target="llvm")["main"]
        tensors = eb.inputs(w, seed=5)
        args, out = eb.kernel_args(w, cfg, (), *tensors)
        kernel(*args)
        torch.testing.assert_close(out, eb.reference(w, *tensors), rtol=1e-5, atol=1e-5, msg=str(cfg))


# ---- the torch op and its modules --------------------------------------------------------------------------
@pytest.fixture
def int8_package(tmp_path, cpu_builder):
    task = make_task("embedding_bag", "cpu", rows=50, dim=16, batch=6, pooling=(0, 5), dtype="int8")
    export([task.record(task.space.default(), costs=(1e-6,))], tmp_path, builder=cpu_builder)
    (kernel,) = load_counting(tmp_path).kernels
    yield kernel
    at.unload_all()


def test_the_op_serves_fused_int8_tables_with_the_kernel_and_others_with_pytorch(int8_package):
    bag = torch.nn.EmbeddingBag(200, 16, mode="sum")
    module = at.EmbeddingBag.quantized(bag, "int8")
    assert isinstance(module, at.QuantizedEmbeddingBag) and module.dtype == "int8"
    assert module.weight.shape == (200, 24) and not module.weight.requires_grad
    idx, off = torch.randint(0, 200, (40,)), torch.tensor([0, 3, 3, 10, 30])
    out = module(idx, off)
    assert int8_package.calls == 1 and out.dtype == torch.float32
    torch.testing.assert_close(out, F.embedding_bag(idx, dequantize(module.weight, "int8"), off, mode="sum"))
    assert (out - bag(idx, off)).abs().max() < 0.1  # within the quantization's error of the fp32 bag
    torch.testing.assert_close(module(idx.view(8, 5)), F.embedding_bag(idx.view(8, 5), dequantize(module.weight, "int8"),
                                                                       mode="sum"))
    half = at.EmbeddingBag.quantized(bag, "float16")
    with pytest.warns(UserWarning, match="dtype=float16"):  # no kernel for fp16 rows loaded: PyTorch pools them
        torch.testing.assert_close(half(idx, off), F.embedding_bag(idx, bag.weight.detach().half().float(), off,
                                                                   mode="sum"))
    assert int8_package.calls == 2
    table = torch.ops.quantized.embedding_bag_byte_prepack(torch.randn(30, 16))  # FBGEMM's own rows load as they are
    torch.testing.assert_close(at.QuantizedEmbeddingBag(table)(idx % 30, off),
                               F.embedding_bag(idx % 30, dequantize(table, "int8"), off, mode="sum"))


def test_tables_that_do_not_fit_the_kernels_are_clear_errors():
    op, idx, off = torch.ops.autotune.embedding_bag, torch.tensor([0, 1, 2]), torch.tensor([0, 1])
    with pytest.raises(InvalidInput, match="fused int8 rows .* got rows of 13 bytes"):
        op(torch.zeros(10, 13, dtype=torch.uint8), idx, off)
    with pytest.raises(InvalidDtype, match="got torch.int16"):
        op(torch.zeros(10, 8, dtype=torch.int16), idx, off)
    with pytest.raises(InvalidInput, match="for inference"):
        op(torch.zeros(10, 8, dtype=torch.float16, requires_grad=True), idx, off)
    with pytest.raises(InvalidDtype, match="per_sample_weights must be torch.float32"):
        op(torch.zeros(10, 8, dtype=torch.float16), idx, off, torch.ones(3, dtype=torch.float16))
    with pytest.raises(InvalidDtype, match="QuantizedEmbeddingBag takes"):
        at.QuantizedEmbeddingBag(torch.zeros(10, 8))
    with pytest.raises(InvalidInput, match="dtype must be float16, bfloat16 or int8"):
        at.EmbeddingBag.quantized(torch.nn.EmbeddingBag(10, 8), "int4")
    w = eb.Workload.from_shape("rows=10,dim=8,batch=2,pooling=1,dtype=int8")
    with pytest.raises(InvalidDtype, match=r"weight must hold int8 rows \(torch.uint8\), got torch.float32"):
        eb.check_inputs(w, torch.zeros(10, 8), idx, off)
    with pytest.raises(InvalidInput, match=r"weight must be \(rows, 16\) \(FBGEMM's fused rows"):
        eb.check_inputs(w, torch.zeros(10, 8, dtype=torch.uint8), idx, off)


# ---- the peers ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", REDUCED)
def test_baselines_are_pytorch_fp32_and_the_peers_at_the_tables_precision(dtype):
    w = eb.Workload.from_shape(f"rows=500,dim=32,batch=16,pooling=1-6,dtype={dtype}")
    tensors = eb.inputs(w, 1)
    paths = eb.baselines(w, *tensors)
    expected = {"torch"} | ({"torch_int8"} if dtype == "int8" else set())
    if fbgemm.available() and dtype != "bfloat16":
        expected.add(f"fbgemm_tbe_{dtype}")
    assert set(paths) == expected
    ref = eb.reference(w, *tensors)
    for name, call in paths.items():  # FBGEMM's TBE keeps an int8 row's scale and bias in fp16
        torch.testing.assert_close(call(), ref, rtol=1e-2, atol=1e-2, msg=name)
    assert eb.traffic(w, *tensors).bytes == tensors[1].numel() * RowFormat(dtype, 32).row_bytes


def test_the_table_batched_op_and_module_serve_reduced_tables(tmp_path, cpu_builder):
    task = make_task("batched_embedding_bag", "cpu", rows=(40, 9), dim=16, batch=4, pooling=(0, 5), dtype="int8")
    export([task.record(task.space.default(), costs=(1e-6,))], tmp_path, builder=cpu_builder)
    (kernel,) = load_counting(tmp_path).kernels
    try:
        fp32 = at.BatchedEmbeddingBag([40, 9], 16)
        module = at.BatchedEmbeddingBag.quantized(fp32, "int8")
        assert "weight" in dict(module.named_buffers()) and "dtype=int8" in repr(module)
        indices = [torch.tensor([0, 39, 5, 7]), torch.tensor([8, 0, 1])]
        offsets = [torch.tensor([0, 1, 1, 3]), torch.tensor([0, 2, 2, 3])]
        out = module(indices, offsets)
        assert kernel.calls == 1 and out.shape == (4, 32) and out.dtype == torch.float32
        values = dequantize(module.weight, "int8")
        expected = torch.cat([F.embedding_bag(indices[0], values[:40], offsets[0], mode="sum"),
                              F.embedding_bag(indices[1], values[40:], offsets[1], mode="sum")], dim=1)
        torch.testing.assert_close(out, expected)
        assert (out - fp32(indices, offsets)).abs().max() < 0.1
        with pytest.raises(InvalidInput, match="fused int8 rows"):
            module.weight = torch.zeros(49, 13, dtype=torch.uint8)
            module(indices, offsets)
    finally:
        at.unload_all()
