from autotune.task import make_task
from cost_model.features import feature_names, featurize


def test_features_have_workload_then_knobs_and_differ_across_shapes():
    a = make_task("embedding_bag", "cpu", rows=1000, dim=64, batch=32, pooling=(1, 8))
    b = make_task("embedding_bag", "cpu", rows=5000, dim=64, batch=32, pooling=(1, 8))
    cfgs = list(a.space)[:5]
    fa, fb = featurize(a.workload, a.space, cfgs), featurize(b.workload, b.space, cfgs)
    names = feature_names(a.workload, a.space)
    assert fa.shape == (5, len(names)) and names[0].startswith("w.") and names[-1].startswith("k.")
    assert (fa != fb).any(axis=1).all()  # the workload part tells shapes apart
    assert (fa[:, -len(a.space.feature_names()):] == fb[:, -len(b.space.feature_names()):]).all()
