"""autotune.allocator: after keep_freed_memory, a large block freed and allocated again is not faulted in again;
a preloaded allocator is left alone."""

from __future__ import annotations

import subprocess
import sys

from autotune import allocator

FAULTS = """
import resource, sys, numpy as np
from autotune.allocator import keep_freed_memory
said = keep_freed_memory() if sys.argv[1] == "keep" else "default"
def faults_of_a_batch():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.empty(64 << 20, dtype=np.uint8); a.fill(1); del a  # a 64 MB activation, written, freed
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_a_batch()
print(said, "|", min(faults_of_a_batch() for _ in range(3)))
"""


def _run(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True).stdout
    said, faults = out.rsplit("|", 1)
    return said.strip(), int(faults)


def test_a_freed_activation_is_reused_without_faulting_its_pages_in_again():
    default_said, default_faults = _run("default")
    said, faults = _run("keep")
    assert said.startswith("glibc") and "freed memory kept" in said
    # by default mapped anew each time: 16,384 pages of 4 KB, or 32 of 2 MB where numpy asks for huge pages
    assert default_faults >= 32
    assert faults * 10 < default_faults


def test_a_preloaded_allocator_is_left_alone(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    assert allocator.keep_freed_memory() == "jemalloc (LD_PRELOAD): left as it is"
