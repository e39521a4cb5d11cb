"""(workload, config) -> feature vector.

Workload numbers come first (rows, dim, batch, pooling, ...), then the config's knob encodings (log2 of
sizes, option index of categorical knobs). With the workload in the features, one model ranks configs
across shapes of an operator, so a log of earlier shapes warms up the search of a new one.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from search_spaces import Config, Space


def feature_names(workload: Any, space: Space) -> list[str]:
    return [f"w.{k}" for k in sorted(workload.numeric_features())] + [f"k.{n}" for n in space.feature_names()]


def featurize(workload: Any, space: Space, configs: Sequence[Config]) -> np.ndarray:
    """One row per config; the workload part is shared by all rows."""
    wf = workload.numeric_features()
    head = [wf[k] for k in sorted(wf)]
    rows = [head + space.encode(c) for c in configs]
    return np.asarray(rows, dtype=np.float32).reshape(len(configs), -1)
