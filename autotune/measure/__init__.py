"""Measuring built candidates: the `Runner` protocol, its result `Measured`, and the runners.

    base.py            Runner (measure a batch of one task's built candidates; close) and Measured
    common.py          what runners share: the measurement core as a worker or server runs it (measure_here),
                       the task's data, harness errors, device and timing checks
    local.py           LocalRunner: a worker process on this machine
    offline.py         OfflineRunner: batches written to a directory, measured on a device the tuner cannot reach
    offline_device.py  the script the offline runner copies to that directory (`python DIR/measure.py`); it
                       needs PyTorch and apache-tvm-ffi only, with the copied runtime (`autotune/runtime.py`)
    rpc.py             RPCRunner: a farm of `autotune rpc server`s behind a TVM RPC tracker, and that server
    cache.py           MeasurementCache: each config measured once, in front of another runner (benchmarks)
    factory.py         make_runner: a runner from `--runner` text (runner_kind checks the text alone)

The measurement core itself (check against the reference, then time the same call) is `autotune/runtime.py`,
which imports nothing of the project so that packages and the offline directory can carry a copy of it.
"""

from __future__ import annotations

from ..runtime import HARNESS, Timing
from .base import Measured, Runner
from .cache import MeasurementCache
from .common import require_local_device
from .factory import make_runner, runner_kind
from .local import LocalRunner
from .offline import OfflineRunner, OfflineTimeout
from .rpc import RPCRunner, RPCUnavailable

__all__ = ["HARNESS", "LocalRunner", "Measured", "MeasurementCache", "OfflineRunner", "OfflineTimeout",
           "RPCRunner", "RPCUnavailable", "Runner", "Timing", "make_runner", "require_local_device", "runner_kind"]
