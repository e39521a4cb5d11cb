"""Helpers for users' own test suites.

    from autotune.testing import assert_package_matches

    def test_kernels_match_pytorch():
        assert_package_matches("kernels/")      # `autotune check kernels/` as a pytest assertion
"""

from __future__ import annotations

import os

from .check import DEFAULT_CASES, DEFAULT_TIMEOUT_S, KernelResult, check

__all__ = ["assert_package_matches"]


def assert_package_matches(path: str | os.PathLike[str], cases: int = DEFAULT_CASES, seed: int | None = None,
                           timeout: float = DEFAULT_TIMEOUT_S) -> list[KernelResult]:
    """Check every kernel of the package that runs here against PyTorch (see `autotune.check`); raise
    AssertionError listing each failing kernel (or saying that none could be checked); return the results."""
    report = check(path, cases=cases, seed=seed, timeout=timeout)
    if not report.ok:
        lines = [r.line() for r in report.failed] or [r.line() for r in report.results]
        raise AssertionError("\n".join([report.verdict()] + lines))
    return report.results
