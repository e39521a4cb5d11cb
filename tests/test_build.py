from autotune.build import Builder
from autotune.task import make_task


def test_builds_in_workers_and_turns_failures_into_error_kinds(monkeypatch):
    task = make_task("templates.faulty", "cpu", shape="n=64")
    bad = make_task("embedding_bag", "cpu", shape="rows=10,dim=8,batch=2,pooling=1")
    with Builder(workers=2, timeout=60) as builder:
        built = builder.build(task, list(task.space)[:2])
        assert all(b.lib and b.error_kind is None and b.build_s > 0 for b in built)
        # a config from another space cannot be scheduled: a build error, not an exception
        (b,) = builder.build(bad, [task.space.default()])
        assert b.lib is None and b.error_kind == "build" and "KeyError" in b.error


def test_builds_carry_program_features_and_featurize_lowers_only():
    task = make_task("templates.faulty", "cpu", shape="n=64")
    configs = [c for c in task.space if c.to_json()["fault"] == "none"]  # lanes 1 and 4: a serial and a vector loop
    with Builder(workers=2, timeout=60) as builder:
        built = builder.build(task, configs)
        assert all(b.lib and b.features.get("p.stores", 0) >= 1 for b in built)
        assert built[0].features != built[1].features
        foreign = make_task("embedding_bag", "cpu", shape="rows=10,dim=8,batch=2,pooling=1").space.default()
        feats = builder.featurize(task, [*configs, foreign])  # one that does not lower: {}
    assert feats[:2] == [b.features for b in built] and feats[2] == {}
