"""What the benchmark scripts share, one module per concern:

- `curves`: a tuning run's figures (best so far, trials to within a margin, the mean curve, spread);
- `contenders`: ways to tune (`LABEL=STRATEGY[:key=value,...]`) and the transfer logs that warm them;
- `remeasure`: configs timed again in interleaved rounds (the reference, the picks, rescoring, anchored scale);
- `summary`: runs summed up per contender, as markdown tables, JSON and a plot;
- `timing`: contenders timed in interleaved rounds in one process;
- `workloads`: the shapes the op-level benchmarks time, and a package of kernels for them;
- `example`: examples/dlrm.py as a module, for the benchmarks of its model.
"""
