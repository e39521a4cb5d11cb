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


def _pseudo_file_module(name):
    """What inspect.getmodule answers for an object compiled from pseudo-file `name`, in this process."""
    import inspect

    code = compile("def f():\n    pass\n", name, "exec")
    scope = {}
    exec(code, scope)
    return inspect.getmodule(scope["f"])


def _cached_module_name(name):
    import inspect

    return inspect.modulesbyfile.get(name)


def test_build_workers_skip_the_module_rescan_of_moduleless_frames():
    """TVMScript's parser asks inspect.getmodule about every frame on the stack; for the pseudo-files under the
    build workers' stacks it would rescan sys.modules each time. The workers record them once (as owned by no
    module): getmodule answers what it answered before, None, from the cache."""
    import inspect

    from autotune.inspect_cache import skip_moduleless_frames

    assert _pseudo_file_module("<a pseudo file>") is None
    skip_moduleless_frames()
    assert inspect.modulesbyfile["<frozen runpy>"].startswith("<no module")
    assert _pseudo_file_module("<string>") is None and _pseudo_file_module("<frozen runpy>") is None
    assert not any(not name.startswith("<") and mod.startswith("<no module") for name, mod in
                   inspect.modulesbyfile.items())  # real files keep their modules
    with Builder(workers=1) as builder:
        pool = builder._started()
        assert pool._initializer is skip_moduleless_frames
        assert pool.submit(_cached_module_name, "<frozen runpy>").result().startswith("<no module")
