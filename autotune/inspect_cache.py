"""Faster TVMScript parsing: tell `inspect` once which stack frames belong to no module.

TVMScript's parser calls `inspect.stack()` / `inspect.getouterframes()` at every prim_func and macro it parses,
and `inspect.getmodule` answers None for a frame whose file no module owns only after rescanning every module
in sys.modules, each time it is asked. Such frames sit under every call in the processes that lower
templates: `<frozen runpy>` in TVM's popen build workers and `python -m autotune.cli`, `<ast>` in TVM's
evaluator, `<string>` in pytest-xdist's workers. Recording those files as owned by no module gives getmodule
the same answer without the rescan, which nearly halves the time a build worker takes to lower a config
(benchmarks/MEASUREMENT.md). Only pseudo-files (`<...>`), which no module's `__file__` can name, are recorded.
"""

from __future__ import annotations

import inspect
import sys

_PSEUDO_FILES = ("<string>", "<ast>", "<stdin>", "<frozen runpy>", "<frozen importlib._bootstrap>",
                 "<frozen importlib._bootstrap_external>")


def skip_moduleless_frames() -> None:
    """Record the usual pseudo-files and those of the frames on the current stack as owned by no module."""
    names = set(_PSEUDO_FILES)
    frame = sys._getframe()
    while frame is not None:
        names.add(frame.f_code.co_filename)
        frame = frame.f_back
    for name in names:
        if name.startswith("<"):
            inspect.modulesbyfile.setdefault(name, f"<no module: {name}>")  # sys.modules.get() of it: None
