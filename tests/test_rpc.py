"""The RPC runner against a real TVM tracker and two `autotune rpc server`s on loopback: tuning, a server killed
mid-run, a candidate that crashes its session, a harness failure, TVM's stock server refused, status, and the
user's errors."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from autotune import records
from autotune.cli import main
from autotune.measure import Timing
from autotune.measure.rpc import Farm, RPCRunner, StockServer, parse_tracker, servers, tracker_summary, url_options
from autotune.task import make_task
from autotune.tuner import tune

FAST = Timing(number=2, repeat=3, min_repeat_ms=1)
KEY, STOCK = "loopback", "stock"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Farm2:
    """A tracker and two `autotune rpc server`s (`first`, `second`), each its own process group; a stock TVM
    server (`stock`, under its own key) is started by the test that needs it."""

    def __init__(self, tmp):
        self.tracker_port, self.first_port, self.second_port, self.stock_port = (free_port() for _ in range(4))
        py = sys.executable
        tracker = f"127.0.0.1:{self.tracker_port}"

        def ours(port):
            return [py, "-m", "autotune.cli", "rpc", "server", "--tracker", tracker, "--key", KEY,
                    "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1)]

        self.procs = {
            "tracker": [py, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(self.tracker_port),
                        "--port-end", str(self.tracker_port + 1), "--silent"],
            "first": ours(self.first_port),
            "second": ours(self.second_port),
            "stock": [py, "-m", "tvm.exec.rpc_server", "--tracker", tracker, "--key", STOCK, "--host", "127.0.0.1",
                      "--port", str(self.stock_port), "--port-end", str(self.stock_port + 1)],
        }
        self.logs = {name: open(tmp / f"{name}.log", "w") for name in self.procs}
        self.popen = {}
        self.popen["tracker"] = self._start("tracker")
        time.sleep(1.0)  # the servers' first connection attempt should find the tracker listening
        for name in ("first", "second"):
            self.popen[name] = self._start(name)

    def _start(self, name):
        return subprocess.Popen(self.procs[name], stdout=self.logs[name], stderr=subprocess.STDOUT,
                                start_new_session=True)

    def wait_for(self, n, timeout=120.0, key=KEY):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if len(servers(tracker_summary("127.0.0.1", self.tracker_port), key)) >= n:
                    return
            except ConnectionError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{n} servers did not register: " + self.log_tail())

    def log_tail(self):
        out = []
        for name, f in self.logs.items():
            f.flush()
            out.append(f"--- {name}\n" + open(f.name).read()[-1500:])
        return "\n".join(out)

    def kill(self, name):
        """The whole process group: the server, its worker and any session process, as a machine dying would."""
        p = self.popen.get(name)
        if p is None:
            return
        try:
            os.killpg(p.pid, signal.SIGKILL)  # also when the leader is gone: its worker may live on
        except ProcessLookupError:
            pass
        p.wait(10)

    def url(self, key=KEY):
        return f"rpc://127.0.0.1:{self.tracker_port}/{key}"

    def close(self):
        for name in ("first", "second", "stock", "tracker"):
            self.kill(name)
        for f in self.logs.values():
            f.close()


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    f = Farm2(tmp_path_factory.mktemp("farm"))
    try:
        f.wait_for(2)
        yield f
    finally:
        f.close()


def test_runner_urls_and_tracker_addresses_are_parsed_or_refused():
    assert Farm.parse("rpc://10.0.0.7:9190/h100") == Farm("10.0.0.7", 9190, "h100")
    assert Farm.parse("rpc://gpu-farm/a100") == Farm("gpu-farm", 9190, "a100")
    for bad in ("rpc://host:9190", "rpc://:9190/k", "tcp://host:1/k", "rpc://host:port/k", "rpc://h:1/a/b"):
        with pytest.raises(ValueError, match="rpc://HOST:PORT/KEY"):
            Farm.parse(bad)
    assert Farm.parse("rpc://h:1/k?timeout=60") == Farm("h", 1, "k")
    assert url_options("rpc://h:1/k?timeout=60&retries=2") == {"timeout": 60.0, "retries": 2}
    assert url_options("rpc://h:1/k") == {}
    for bad, match in [("?timout=60", "unknown option 'timout'"), ("?timeout=x", "bad timeout='x'"),
                       ("?timeout=0", "bad timeout='0'"), ("?retries=1.5", "bad retries='1.5'")]:
        with pytest.raises(ValueError, match=match):
            Farm.parse("rpc://h:1/k" + bad)
    assert parse_tracker("127.0.0.1:9191") == ("127.0.0.1", 9191)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_tracker("127.0.0.1:x")


def test_an_unreachable_tracker_is_one_line_and_exit_2(tmp_path, capsys):
    port = free_port()  # nothing listens there
    rc = main(["tune", "templates.faulty", "--shape", "n=8", "--trials", "2", "--log", str(tmp_path / "l.jsonl"),
               "--runner", f"rpc://127.0.0.1:{port}/{KEY}", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"cannot reach the RPC tracker at 127.0.0.1:{port}" in err[0]
    assert not (tmp_path / "l.jsonl").exists()
    assert main(["rpc", "status", "--tracker", f"127.0.0.1:{port}"]) == 2
    assert main(["tune", "templates.faulty", "--shape", "n=8", "--log", str(tmp_path / "l.jsonl"),
                 "--runner", "rpc://127.0.0.1/"]) == 2


def test_status_shows_the_servers_per_key(farm, capsys):
    assert main(["rpc", "status", "--tracker", f"127.0.0.1:{farm.tracker_port}"]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == [KEY])
    assert row[1:3] == ["2", "2"], out  # two servers, both free
    assert f"127.0.0.1:{farm.first_port}" in out and f"127.0.0.1:{farm.second_port}" in out


def test_tuning_survives_a_server_killed_mid_run(farm, tmp_path, cpu_builder):
    """A server dies as its candidate is sent; that candidate is measured on the other server, the run
    finishes, and the log holds every trial exactly once."""
    task = make_task("embedding_bag", "cpu", rows=200, dim=8, batch=16, pooling=(1, 6))
    log, said, dispatched = tmp_path / "eb.jsonl", [], []

    def on_dispatch(server, cfg):
        dispatched.append(server[1])
        if server[1] == farm.first_port and len(dispatched) >= 3 and "killed" not in said:
            said.append("killed")
            farm.kill("first")

    runner = RPCRunner(farm.url(), FAST, timeout=60, say=said.append, on_dispatch=on_dispatch)
    try:
        res = tune(task, trials=8, log=log, batch_size=4, runner=runner, timing=FAST, progress=False, seed=1, confirm=0,
                   builder=cpu_builder)
    finally:
        runner.close()
    recs = list(records.load(log))
    print("\n".join(f"{r.config_key}: {r.error_kind or 'ok'}" for r in recs))
    print("\n".join(said))
    assert "killed" in said, f"no candidate was sent to the first server: {dispatched}"
    assert any("went away" in s for s in said)  # its in-flight candidate was measured again elsewhere
    assert res.measured == 8 and len(recs) == 8
    assert len({r.config_key for r in recs}) == 8  # every trial once
    assert not [r for r in recs if r.error_kind in ("crash", "timeout", "harness")], [r.error for r in recs]
    assert res.best is not None
    assert servers(tracker_summary("127.0.0.1", farm.tracker_port), KEY) == [("127.0.0.1", farm.second_port)]


def test_a_crashing_candidate_is_recorded_and_its_server_serves_on(farm, cpu_builder):
    task = make_task("templates.faulty", "cpu", shape="n=64")
    cfgs = [c for c in task.space if c.as_dict()["fault"] != "hang"]
    runner = RPCRunner(farm.url(), FAST, timeout=60, say=lambda msg: None)
    try:
        out = runner.measure(task, cpu_builder.build(task, cfgs))
    finally:
        runner.close()
    kinds = {(m.built.config.as_dict()["fault"], m.built.config.as_dict()["lanes"]): m for m in out}
    assert kinds[("crash", 1)].error_kind == "crash" and "still up" in kinds[("crash", 1)].error
    assert kinds[("wrong", 4)].error_kind == "wrong"
    assert kinds[("none", 1)].error_kind is None and len(kinds[("none", 1)].costs) == 3
    assert ("127.0.0.1", farm.second_port) in servers(tracker_summary("127.0.0.1", farm.tracker_port), KEY)


def test_a_task_whose_data_cannot_be_made_on_the_server_is_a_harness_error(farm, cpu_builder):
    """Inputs for n=-1 cannot be made (torch.arange(-1)) on the server: no candidate is to blame."""
    task = make_task("templates.faulty", "cpu", shape="n=8")
    cfgs = [c for c in task.space if c.as_dict()["fault"] == "none"]
    runner = RPCRunner(farm.url(), FAST, timeout=60, say=lambda msg: None)
    try:
        out = runner.measure(make_task("templates.faulty", "cpu", shape="n=-1"), cpu_builder.build(task, cfgs))
    finally:
        runner.close()
    assert [m.error_kind for m in out] == ["harness"] * len(cfgs)
    assert all("making the task's inputs on the RPC server failed" in m.error for m in out)


def test_the_stock_tvm_server_is_refused_with_what_to_run_instead(farm, cpu_builder):
    """It could only time with time_evaluator, not the call path users run: refused, not measured otherwise."""
    farm.popen["stock"] = farm._start("stock")
    farm.wait_for(1, key=STOCK)
    task = make_task("templates.faulty", "cpu", shape="n=8")
    runner = RPCRunner(farm.url(STOCK), FAST, timeout=60, say=lambda msg: None)
    try:
        with pytest.raises(StockServer, match="autotune rpc server --tracker"):
            runner.measure(task, cpu_builder.build(task, [task.space.default()]))
    finally:
        runner.close()
        farm.kill("stock")


@pytest.mark.slow
def test_tune_model_tunes_a_model_through_the_farm_and_a_local_run_picks_the_same_kernels(farm, tmp_path,
                                                                                         cpu_builder):
    """tune_model(runner="rpc://...") measures every task's candidates on the farm's servers; a local run over the
    same records tunes nothing and rewrites the model on the same kernels. (The interaction's rule alone: one
    task, which keeps the test short beside the suite's other workers.)"""
    import shutil

    import torch

    import autotune.torch as at
    import search_spaces
    from test_tune_model import TinyDLRM, make_batch

    torch.manual_seed(0)
    model = TinyDLRM().eval()
    args = make_batch(model, 8)
    kw = dict(trials=2, quantize=False, progress=False, bench_rounds=0, require_speedup=False, builder=cpu_builder,
              rules=search_spaces.get("interaction").graph_rules())
    # a cold server's first session on a loaded machine can outlast the default 30 s a candidate: the URL says 60
    remote, report = at.tune_model(model, args, log_dir=tmp_path / "farm", runner=farm.url() + "?timeout=60", **kw)
    assert [t.op for t in report.tasks] == ["interaction"] and report.measured >= 2, str(report)
    assert all(t.record is not None for t in report.tasks) and report.replaced, str(report)
    shutil.copytree(tmp_path / "farm", tmp_path / "local", ignore=shutil.ignore_patterns("package"))
    local, again = at.tune_model(model, args, log_dir=tmp_path / "local", **kw)
    assert again.measured == 0
    assert {t.key: t.record.config_key for t in again.tasks} == {t.key: t.record.config_key for t in report.tasks}
    assert [r.rule for r in again.replaced] == [r.rule for r in report.replaced]
    other = make_batch(model, 13, seed=1)
    with torch.inference_mode():
        torch.testing.assert_close(remote(*other), local(*other), rtol=0, atol=0)
        torch.testing.assert_close(remote(*other), model(*other), rtol=1e-4, atol=1e-4)
