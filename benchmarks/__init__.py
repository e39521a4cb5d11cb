"""Benchmarks: thin scripts over a small library (`benchmarks.lib`), run from the repository root as modules:

    python -m benchmarks.search_quality --help

They may import `autotune`, `cost_model` and `search_spaces`; nothing there imports them (the layers run
search_spaces -> cost_model -> autotune -> benchmarks). What they measured, with the command, date and machine,
is kept in the `*.md` files beside them.
"""
