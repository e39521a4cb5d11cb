"""Shared by the templates' GPU tests: build sampled configs for a CUDA architecture and check the limits.

There is no GPU here or in CI, so a GPU kernel is checked as far as a machine without one can: it lowers,
passes TVM's GPU verification, compiles with nvcc for the architecture, and ptxas's resource report fits
the device. Invalid configs must be rejected as `invalid` records, never crash the build.
"""

from __future__ import annotations

import random

from autotune.build import Builder, Built
from autotune.task import Task, make_task

ARCHS = ("sm_80", "sm_90")


def build_sample(builder: Builder, op: str, arch: str, n: int, seed: int = 0, **fields) -> tuple[Task, list[Built]]:
    """The default config and n-1 random ones of the task's GPU space, built for `cuda:<arch>`."""
    task = make_task(op, f"cuda:{arch}", **fields)
    rng = random.Random(seed)
    space = task.space
    configs = [space.default()]
    for _ in range(20 * n):
        if len(configs) >= n:
            break
        cfg = space.sample(rng)
        if cfg not in configs:
            configs.append(cfg)
    return task, builder.build(task, configs)


def assert_built_within_limits(task: Task, built: list[Built]) -> None:
    """Every config compiled (or was rejected as invalid before compiling) and fits the device."""
    spec = task.device.gpu
    assert spec is not None
    failures = [(b.config, b.error_kind, b.error) for b in built if b.error_kind not in (None, "invalid")]
    assert not failures, failures
    ok = [b for b in built if b.lib is not None]
    assert ok, "no config of the sample compiled"
    for b in ok:
        assert b.usage, "ptxas reported no kernel"
        for k in b.usage:
            assert 0 < k.threads <= spec.max_threads_per_block, k
            assert k.registers * k.threads <= spec.registers_per_block, k
            assert k.shared_bytes <= spec.shared_memory_per_block, k
