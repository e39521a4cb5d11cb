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
