import math

import numpy as np

from autotune.task import make_task
from cost_model.features import Columns, TaskFeaturizer, device_features, row


def test_rows_name_workload_device_and_knobs_and_differ_across_shapes():
    a = make_task("embedding_bag", "cpu", rows=1000, dim=64, batch=32, pooling=(1, 8))
    b = make_task("embedding_bag", "cpu", rows=5000, dim=64, batch=32, pooling=(1, 8))
    cfg = a.space.default()
    ra = row(a.op, a.workload, a.space, cfg, a.device.to_json(), None, "knobs")
    rb = row(b.op, b.workload, b.space, cfg, b.device.to_json(), None, "knobs")
    assert ra["op.embedding_bag"] == 1.0 and ra["w.rows"] != rb["w.rows"]
    assert {k for k in ra if k.startswith("k.embedding_bag.")} and not any(k.startswith("p.") for k in ra)
    assert ra["d.cores"] == a.device.cores
    prog = row(a.op, a.workload, a.space, cfg, a.device.to_json(), {"p.x": 2.0}, "program")
    assert prog["p.x"] == 2.0 and not any(k.startswith("k.") for k in prog)


def test_device_features_tell_cpu_models_and_gpus_apart():
    er = device_features({"kind": "llvm", "mcpu": "emeraldrapids", "num-cores": 2})
    zen3 = device_features({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})
    assert er["d.avx512f"] == 1.0 and zen3["d.avx512f"] == 0.0 and zen3["d.avx2"] == 1.0
    gpu = device_features({"kind": "cuda", "arch": "sm_90"})
    assert gpu["d.gpu"] == 1.0 and gpu["d.sm"] == 90.0


def test_columns_fill_missing_names_with_nan():
    cols = Columns.union([{"a": 1.0}, {"b": 2.0}])
    m = cols.matrix([{"a": 1.0}, {"b": 2.0, "zzz": 3.0}])
    assert cols.names == ("a", "b") and m[0, 0] == 1.0 and math.isnan(m[0, 1]) and m[1, 1] == 2.0


def test_task_featurizer_matrix_equals_the_rows():
    task = make_task("qmatmul", "cpu", shape="m=10,k=40,n=24,relu=1")
    cfgs = list(task.space)[:7]
    for fs in ("knobs", "all"):
        f = TaskFeaturizer(task.op, task.workload, task.space, task.device.to_json(), fs)
        f.program[cfgs[0]] = {"p.sum.0": 5.0}
        cols = Columns(f.names() | {"p.sum.0", "w.other"})
        np.testing.assert_array_equal(f.matrix(cols, cfgs), cols.matrix([f.row(c) for c in cfgs]))
