"""Embedding tables in 2 MB pages (search_spaces/embedding_bag/pages.py): the copies hold the same values, live as
long as the tensor, are 2 MB-aligned, and where Linux' transparent huge pages are not off, the kernel backs them
with huge pages."""

import gc
import sys
from pathlib import Path

import pytest
import torch

import autotune.torch as at
from search_spaces import embedding_bag as eb
from search_spaces.embedding_bag import pages
from search_spaces.embedding_bag.rows import dequantize, quantize
from search_spaces.embedding_bag.workload import table

LARGE = (pages.MIN_TABLE_BYTES // 4 // 64 + 1, 64)  # float32 rows just above the threshold
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str | None:
    """The bracketed mode of Linux' THP switch ("always", "madvise", "never"), or None where there is none."""
    try:
        text = THP.read_text()
    except OSError:
        return None
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else None


@pytest.mark.skipif(not pages.supported(), reason="no madvise(MADV_HUGEPAGE) on this platform")
def test_a_large_table_is_copied_into_aligned_memory_that_outlives_its_source():
    src = torch.randn(*LARGE)
    copy = pages.in_huge_pages(src)
    assert copy is not src and copy.is_contiguous() and copy.dtype == src.dtype and torch.equal(copy, src)
    assert copy.data_ptr() % pages.HUGE_PAGE_BYTES == 0
    expected = src.clone()
    del src
    gc.collect()
    copy.add_(0)  # its memory is the copy's own: still there, still writable
    assert torch.equal(copy, expected)


@pytest.mark.skipif(thp_mode() in (None, "never") or not pages.supported(),
                    reason="transparent huge pages are off (or not Linux)")
def test_the_kernel_backs_the_copy_with_huge_pages():
    copy = pages.in_huge_pages(torch.ones(*LARGE))
    assert pages.huge_page_bytes(copy) >= pages.HUGE_PAGE_BYTES
    plain = torch.ones(*LARGE)
    assert pages.huge_page_bytes(plain) == 0 or thp_mode() == "always"  # what madvise mode gives PyTorch


def test_small_tables_and_other_tensors_are_served_as_they_are():
    small = torch.randn(100, 64)
    assert pages.in_huge_pages(small) is small
    assert pages.empty((100, 64), torch.float32).shape == (100, 64)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_tables_converted_for_the_kernels_are_in_huge_page_memory(dtype):
    rows = pages.MIN_TABLE_BYTES // 64 + 1  # above the threshold in every dtype's rows (int8 ones: 72 bytes)
    bag = torch.nn.EmbeddingBag(rows, 64, mode="sum")
    weight = bag.weight.detach()
    # what the modules hold: a reduced-precision conversion, or the fp32 tables concatenated
    converted = (at.BatchedEmbeddingBag.from_modules([bag]) if dtype == "float32"
                 else at.EmbeddingBag.quantized(bag, dtype)).weight.detach()
    assert torch.allclose(dequantize(converted, dtype), weight, atol=0.05, rtol=0.01)
    assert torch.equal(converted, quantize(weight, dtype))  # the conversion itself, wherever it lives
    if sys.platform.startswith("linux"):
        assert converted.data_ptr() % pages.HUGE_PAGE_BYTES == 0
        assert table(rows, 64, dtype, seed=0).data_ptr() % pages.HUGE_PAGE_BYTES == 0  # what the tuner times


def test_a_module_on_a_huge_page_table_trains_and_loads_its_state():
    bags = [torch.nn.EmbeddingBag(LARGE[0] // 2 + 1, 64, mode="sum") for _ in range(2)]
    module = at.BatchedEmbeddingBag.from_modules(bags)
    if sys.platform.startswith("linux"):
        assert module.weight.data_ptr() % pages.HUGE_PAGE_BYTES == 0
    idx, off = [torch.tensor([0, 5, 7]), torch.tensor([1, 2])], [torch.tensor([0, 2]), torch.tensor([0, 1])]
    module(idx, off).sum().backward()
    assert module.weight.grad is not None and module.weight.grad[5].abs().sum() > 0
    state = {k: torch.zeros_like(v) if k == "weight" else v for k, v in module.state_dict().items()}
    address = module.weight.data_ptr()
    module.load_state_dict(state)
    assert module.weight.data_ptr() == address and module.weight.abs().sum() == 0  # loaded in place, in its pages


def test_the_bench_times_pytorch_on_the_same_pages_and_on_its_own_memory():
    w = eb.Workload.from_shape(f"rows={pages.MIN_TABLE_BYTES // 256 + 1},dim=64,batch=16,pooling=1-6")
    tensors = eb.inputs(w, 1)
    paths = eb.baselines(w, *tensors)
    assert {"torch", "torch_own_memory"} <= set(paths)
    ref = eb.reference(w, *tensors)
    for name in ("torch", "torch_own_memory"):
        torch.testing.assert_close(paths[name](), ref, msg=name)


def test_only_tensors_are_moved():
    with pytest.raises(TypeError, match="in_huge_pages takes a tensor, got list"):
        at.in_huge_pages([1.0, 2.0])
    param = torch.nn.Parameter(torch.randn(*LARGE))
    moved = at.in_huge_pages(param)  # the values, not an autograd node of the Parameter
    assert not moved.requires_grad and moved.grad_fn is None and torch.equal(moved, param.detach())


def test_a_users_parameter_moves_into_huge_pages_in_place():
    bag = torch.nn.EmbeddingBag(*LARGE, mode="sum")
    param, values = bag.weight, bag.weight.detach().clone()
    bag.weight.data = at.in_huge_pages(bag.weight.data)
    assert bag.weight is param and torch.equal(bag.weight, values)
    if sys.platform.startswith("linux"):
        assert bag.weight.data_ptr() % pages.HUGE_PAGE_BYTES == 0
    out = at.EmbeddingBag.from_module(bag)(torch.tensor([1, 2, 3]), torch.tensor([0, 2]))
    torch.testing.assert_close(out, torch.nn.functional.embedding_bag(
        torch.tensor([1, 2, 3]), values, torch.tensor([0, 2]), mode="sum"))
