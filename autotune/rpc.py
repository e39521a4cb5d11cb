"""`--runner rpc://HOST:PORT/KEY`: measure on a farm of devices through TVM's RPC tracker and servers.

The tuner builds here (cross-compiling for the devices' target); each candidate's library is uploaded to a
server registered under KEY, run once on inputs made here from the template's `inputs`, its output copied back
and compared with the PyTorch reference here, and only a correct one is timed on the device with TVM's
`time_evaluator`: the local runner's method. A batch is spread over the servers, one slot per server: each slot
is a worker process (TVM's PopenWorker, so a hung call is killed by a timeout) holding one RPC session, with
the task's inputs uploaded once, for the batch.

Faults cost only the candidates in flight. A session that is lost is attributed with the tracker's help: if
the server is gone from the tracker, the server died and the candidate is measured again on another one (up
to `retries` times); if the server is still registered, the candidate ended its own session (a crash) and is
recorded as such. A candidate that outlasts `timeout` is recorded as a `timeout` and its slot starts a new
session (TVM's server ends the hung one when the session's timeout expires).

TVM's stock server stops serving after a session process dies abnormally (a segfaulting candidate): a farm
that should outlive such candidates runs `autotune rpc server`, which is TVM's server with that one thing
changed.
"""

from __future__ import annotations

import collections
import math
import os
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from .build import Built, _last_lines
from .measure import Measured, Timing, mismatch, task_data
from .task import Task

DEFAULT_TRACKER_PORT = 9190


class RPCUnavailable(ConnectionError):
    """The tracker cannot be reached, or no server is (left) under the key: the user's setup, not a bug."""


@dataclass(frozen=True)
class Farm:
    """Where the devices are: a tracker's address and the key their servers registered under."""

    host: str
    port: int
    key: str

    @classmethod
    def parse(cls, url: str) -> "Farm":
        """`rpc://HOST:PORT/KEY` (port 9190 if omitted)."""
        parts = urlsplit(url)
        key = parts.path.strip("/")
        try:
            port = parts.port or DEFAULT_TRACKER_PORT
        except ValueError:
            port = -1
        if parts.scheme != "rpc" or not parts.hostname or not key or "/" in key or port <= 0:
            raise ValueError(f"bad RPC runner {url!r}; expected rpc://HOST:PORT/KEY, e.g. rpc://127.0.0.1:9190/a100")
        return cls(parts.hostname, port, key)

    def __str__(self) -> str:
        return f"rpc://{self.host}:{self.port}/{self.key}"


def parse_tracker(text: str) -> tuple[str, int]:
    """`HOST:PORT` (or HOST, port 9190) -> (host, port)."""
    host, _, port = text.rpartition(":") if ":" in text else (text, "", str(DEFAULT_TRACKER_PORT))
    if not host or not port.isdigit():
        raise ValueError(f"bad tracker address {text!r}; expected HOST:PORT, e.g. 127.0.0.1:9190")
    return host.strip("[]"), int(port)


# ---- talking to the tracker (TVM's wire protocol, with timeouts) --------------------------------------------
def _tracker_socket(host: str, port: int, timeout: float | None) -> socket.socket:
    import struct

    from tvm.rpc import base

    try:
        sock = socket.create_connection((host, port), timeout=5.0)
        sock.settimeout(10.0)
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        magic = struct.unpack("<i", base.recvall(sock, 4))[0]
    except OSError as err:
        raise RPCUnavailable(f"cannot reach the RPC tracker at {host}:{port}: {err.strerror or err}") from None
    if magic != base.RPC_TRACKER_MAGIC:
        sock.close()
        raise RPCUnavailable(f"{host}:{port} is not an RPC tracker")
    sock.settimeout(timeout)
    return sock


def tracker_summary(host: str, port: int) -> dict[str, Any]:
    """The tracker's own summary: {"queue_info": {key: {free, pending}}, "server_info": [{key, addr}]}."""
    from tvm.rpc import base

    sock = _tracker_socket(host, port, timeout=10.0)
    try:
        base.sendjson(sock, [base.TrackerCode.SUMMARY])
        value = base.recvjson(sock)
    except (OSError, RuntimeError) as err:
        raise RPCUnavailable(f"the RPC tracker at {host}:{port} did not answer: {err}") from None
    finally:
        sock.close()
    if value[0] != base.TrackerCode.SUCCESS:
        raise RPCUnavailable(f"the RPC tracker at {host}:{port} answered {value!r}")
    return value[1]


def servers(summary: dict[str, Any], key: str) -> list[tuple[str, int]]:
    """Addresses of the servers registered under `key`, busy or free."""
    return [(s["addr"][0], int(s["addr"][1])) for s in summary.get("server_info", []) if s.get("key") == f"server:{key}"]


def status_text(host: str, port: int) -> str:
    """What `autotune rpc status` prints: servers and, per key, how many are registered, free and waited for."""
    summary = tracker_summary(host, port)
    keys = sorted(set(summary.get("queue_info", {})) | {s["key"].split(":", 1)[1] for s in summary.get("server_info", [])
                                                          if s.get("key", "").startswith("server:")})
    lines = [f"tracker {host}:{port}: {len(summary.get('server_info', []))} servers"]
    width = max([len(k) for k in keys] + [3])
    lines.append(f"  {'key':<{width}}  servers  free  pending")
    for k in keys:
        q = summary.get("queue_info", {}).get(k, {"free": 0, "pending": 0})
        lines.append(f"  {k:<{width}}  {len(servers(summary, k)):>7}  {q['free']:>4}  {q['pending']:>7}")
    for s in sorted(summary.get("server_info", []), key=lambda s: (s["key"], s["addr"])):
        lines.append(f"  server {s['addr'][0]}:{s['addr'][1]}  {s['key'].split(':', 1)[1]}")
    return "\n".join(lines)


# ---- the measure worker's side (runs in a PopenWorker, one per slot) ----------------------------------------
_SESSION: dict[str, Any] = {}  # the worker's open session: sess, dev, remote copies of the inputs, server


def _open_session(farm: Farm, task: Task, seed: int, session_timeout: float) -> tuple[str, int]:
    """Ask the tracker for a server of the key (waiting while all are busy), connect, upload the inputs."""
    import tvm
    from tvm import rpc
    from tvm.rpc import base

    _close_session()
    inputs, _ = task_data(task, seed)  # made here, before a server is held
    sock = _tracker_socket(farm.host, farm.port, timeout=None)
    try:
        base.sendjson(sock, [base.TrackerCode.REQUEST, farm.key, "", 1])
        value = base.recvjson(sock)
    finally:
        sock.close()
    if value[0] != base.TrackerCode.SUCCESS:
        raise RPCUnavailable(f"the tracker refused a {farm.key} server: {value!r}")
    url, port, matchkey = value[1]
    sess = rpc.connect(url, port, matchkey, session_timeout=max(1, int(session_timeout)))
    dev = sess.cuda(0) if task.device.is_gpu else sess.cpu(0)
    remote = {id(t): tvm.runtime.tensor(t.numpy(), dev) for t in inputs if _is_tensor(t)}
    _SESSION.update(sess=sess, dev=dev, remote=remote, server=(url, int(port)), uploads=0, seed=seed)
    return url, int(port)


def _close_session() -> None:
    _SESSION.clear()  # dropping the last reference to the session closes it


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def _alive() -> bool:
    try:
        _SESSION["sess"].get_function("tvm.rpc.server.workpath")("probe")
        return True
    except Exception:  # the session is gone
        return False


def _after_error(task: Task, err: Exception) -> tuple[tuple[float, ...], str, str, str]:
    """A remote call failed: the kernel's error on a live session, or the session itself is gone."""
    msg = f"{type(err).__name__}: {_last_lines(str(err))}"
    if not _alive():
        _close_session()
        return (), "crash", msg, "lost"
    if task.device.is_gpu:  # a CUDA error poisons the session's context: the next candidate gets a fresh one
        _close_session()
        return (), "runtime", msg, "reset"
    return (), "runtime", msg, "ok"


def _measure_remote(task: Task, cfg: Any, lib: str, timing: Timing) -> tuple[tuple[float, ...], str | None,
                                                                             str | None, str]:
    """(costs, error_kind, error, session status): upload, run once, check here, then time on the device."""
    import torch
    import tvm

    if not _SESSION:
        return (), "crash", "no RPC session", "lost"
    sess, dev, remote = _SESSION["sess"], _SESSION["dev"], _SESSION["remote"]
    inputs, ref = task_data(task, _SESSION["seed"])
    args, out = task.kernel_args(cfg, task.pack(cfg, inputs), inputs)  # packing is not timed, as locally
    try:
        name = f"c{_SESSION['uploads']}.so"
        _SESSION["uploads"] += 1
        sess.upload(lib, name)
        mod = sess.load_module(name)
        rargs = [(remote[id(a)] if id(a) in remote else tvm.runtime.tensor(a.numpy(), dev)) if _is_tensor(a) else a
                 for a in args]
        mod["main"](*rargs)
        for a, r in zip(args, rargs):  # the output (and whatever shares its storage) comes back
            if _is_tensor(a) and a.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
                a.copy_(torch.from_numpy(r.numpy()))
    except Exception as err:
        return _after_error(task, err)
    why = mismatch(task, out, ref)
    if why is not None:
        return (), "wrong", why, "ok"
    try:
        costs = _time_remote(task, mod, dev, rargs, timing)
    except Exception as err:
        return _after_error(task, err)
    return costs, None, None, "ok"


def _time_remote(task: Task, mod: Any, dev: Any, rargs: Sequence[Any], timing: Timing) -> tuple[float, ...]:
    """TVM's time_evaluator on the device. CPU: as `LocalRunner`. GPU: as the local and offline runners, L2
    flushed before every call and each call timed alone (CUDA events), a repeat being the mean of its calls."""
    if not task.device.is_gpu:
        f = mod.time_evaluator("main", dev, number=timing.number, repeat=timing.repeat,
                               min_repeat_ms=int(timing.min_repeat_ms))
        return tuple(float(c) for c in f(*rargs).results)
    flush = 2 * (task.device.gpu.l2_bytes if task.device.gpu else 0) or (1 << 20)
    probe = mod.time_evaluator("main", dev, number=1, repeat=max(timing.number, 1), cache_flush_bytes=flush)
    t0 = time.perf_counter()
    probe(*rargs)
    per_call = (time.perf_counter() - t0) / max(timing.number, 1)  # with the flush and the RPC round trip
    calls = int(max(timing.number, min(10_000, math.ceil(timing.min_repeat_ms / 1e3 / max(per_call, 1e-7)))))
    f = mod.time_evaluator("main", dev, number=1, repeat=calls * timing.repeat, cache_flush_bytes=flush)
    res = list(f(*rargs).results)
    return tuple(statistics.fmean(res[i * calls:(i + 1) * calls]) for i in range(timing.repeat))


# ---- the tuner's side -----------------------------------------------------------------------------------------
@dataclass
class _Item:
    built: Built
    attempts: int = 0  # times its server went away while it was being measured


class RPCRunner:
    """Measures a batch in parallel on the servers registered under a key at a TVM RPC tracker.

    `timeout`: per candidate (upload, check, timing); `prepare_timeout`: to get a server and upload the inputs;
    `retries`: how often a candidate whose server died is measured again elsewhere; `wait_s`: how long to wait
    for a server when none is registered; `on_dispatch(server, config)` is called as each candidate is sent.
    """

    def __init__(self, farm: Farm | str, timing: Timing = Timing(), timeout: float = 30.0,
                 prepare_timeout: float = 600.0, retries: int = 1, max_parallel: int | None = None,
                 wait_s: float = 60.0, say: Callable[[str], None] | None = None,
                 on_dispatch: Callable[[tuple[str, int], Any], None] | None = None):
        self.farm = farm if isinstance(farm, Farm) else Farm.parse(farm)
        self.timing = timing
        self.timeout = timeout
        self.prepare_timeout = prepare_timeout
        self.retries = retries
        self.max_parallel = max_parallel
        self.wait_s = wait_s
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.on_dispatch = on_dispatch
        self._workers: list[Any] = []
        self.summary()  # an unreachable tracker fails here, before anything is built

    def summary(self) -> dict[str, Any]:
        return tracker_summary(self.farm.host, self.farm.port)

    def _worker(self, i: int) -> Any:
        from tvm.support.popen_pool import PopenWorker

        while len(self._workers) <= i:
            self._workers.append(PopenWorker())
        return self._workers[i]

    def measure(self, task: Task, built: Sequence[Built]) -> list[Measured]:
        done: dict[int, Measured] = {id(b): Measured(b, (), b.error_kind, b.error) for b in built if b.lib is None}
        queue = collections.deque(_Item(b) for b in built if b.lib is not None)
        session_timeout = self.prepare_timeout + self.timeout * len(queue) * (self.retries + 1)
        lock = threading.Lock()
        last_progress = time.monotonic()
        try:
            while queue:
                n = min(len(queue), len(servers(self.summary(), self.farm.key)), self.max_parallel or len(queue))
                if n == 0:
                    if time.monotonic() - last_progress > self.wait_s:
                        raise RPCUnavailable(
                            f"no server under key {self.farm.key!r} at {self.farm.host}:{self.farm.port} for "
                            f"{self.wait_s:.0f} s; {len(queue)} candidates of this batch unmeasured (see `autotune "
                            f"rpc status --tracker {self.farm.host}:{self.farm.port}`; rerun to resume)")
                    time.sleep(1.0)
                    continue
                before = len(done)
                threads = [threading.Thread(target=self._slot, args=(self._worker(i), task, queue, done, lock,
                                                                     session_timeout), daemon=True)
                           for i in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                if len(done) > before:
                    last_progress = time.monotonic()
                elif queue and time.monotonic() - last_progress > self.wait_s:
                    raise RPCUnavailable(f"no {self.farm.key!r} server measured anything for {self.wait_s:.0f} s; "
                                         f"{len(queue)} candidates unmeasured; rerun to resume")
                elif queue:
                    time.sleep(1.0)
        finally:
            for b in built:
                if b.lib is not None:
                    try:
                        os.unlink(b.lib)
                    except OSError:
                        pass
        return [done[id(b)] for b in built]

    def _call(self, worker: Any, fn: Any, args: tuple[Any, ...], timeout: float) -> Any:
        worker.send(fn, args, timeout=timeout)
        return worker.recv()

    def _slot(self, worker: Any, task: Task, queue: collections.deque, done: dict[int, Measured],
              lock: threading.Lock, session_timeout: float) -> None:
        """One server's share of the batch: take candidates until none is left or the server is lost."""
        server: tuple[str, int] | None = None
        opened = 0
        while True:
            with lock:
                if not queue:
                    break
            if server is None:
                if opened and not self._free_server():
                    break  # lost ours and none is free: the other slots finish the batch
                try:
                    server = self._call(worker, _open_session, (self.farm, task, self.timing.seed, session_timeout),
                                        self.prepare_timeout)
                    opened += 1
                except Exception as err:  # no server within prepare_timeout, or it died while we connected
                    self.say(f"rpc: could not open a session on a {self.farm.key} server: {_last_lines(str(err), 1)}")
                    break
            with lock:
                if not queue:
                    break
                item = queue.popleft()
            b = item.built
            if self.on_dispatch is not None:
                self.on_dispatch(server, b.config)
            try:
                costs, kind, msg, status = self._call(worker, _measure_remote, (task, b.config, b.lib, self.timing),
                                                      self.timeout)
            except TimeoutError:
                done[id(b)] = Measured(b, (), "timeout", f"no result from {_addr(server)} within "
                                                         f"{self.timeout:.0f} s (hang?)")
                server = None  # the worker was killed; TVM's server ends the session at its timeout
                continue
            except ChildProcessError:
                costs, kind, msg, status = (), "crash", "the measure worker died", "lost"
            except Exception as err:  # raised in the worker outside the kernel (e.g. packing)
                costs, kind, msg, status = (), "runtime", f"{type(err).__name__}: {_last_lines(str(err))}", "ok"
            if status == "lost":
                lost, server = server, None
                if self._still_registered(lost):
                    done[id(b)] = Measured(b, (), "crash", f"it ended its RPC session on {_addr(lost)} "
                                                           f"(the server is still up): {msg}")
                elif item.attempts < self.retries:
                    item.attempts += 1
                    self.say(f"rpc: server {_addr(lost)} went away; measuring its candidate on another server")
                    with lock:
                        queue.appendleft(item)
                else:
                    done[id(b)] = Measured(b, (), "crash", f"its RPC server went away each of the "
                                                           f"{item.attempts + 1} times it ran: {msg}")
                continue
            if status == "reset":
                server = None
            done[id(b)] = Measured(b, tuple(costs), kind, msg)
        if server is not None:
            try:
                self._call(worker, _close_session, (), 30.0)
            except Exception:
                pass

    def _free_server(self) -> bool:
        try:
            q = self.summary().get("queue_info", {}).get(self.farm.key, {})
        except RPCUnavailable:
            return False
        return q.get("free", 0) > 0

    def _still_registered(self, server: tuple[str, int] | None, grace_s: float = 2.0) -> bool:
        """Whether a server whose session was lost is still at the tracker (then the candidate crashed it).

        A dead server's tracker connection closes with it; the tracker is given `grace_s` to notice."""
        deadline = time.monotonic() + grace_s
        while True:
            try:
                listed = server in servers(self.summary(), self.farm.key)
            except RPCUnavailable:
                return False
            if not listed or time.monotonic() > deadline:
                return listed
            time.sleep(0.2)

    def close(self) -> None:
        for w in self._workers:
            w.kill()
        self._workers = []


def _addr(server: tuple[str, int] | None) -> str:
    return "?" if server is None else f"{server[0]}:{server[1]}"


# ---- `autotune rpc server`: TVM's server, kept serving after a candidate kills its session --------------------
def keep_serving_after_crash() -> None:
    """TVM's server (`tvm.rpc.server`) stops serving when a session process dies abnormally, i.e. when a
    segfaulting candidate is measured on it; here that is logged and the next session is served.

    Runs in the server's process, as `tvm.rpc.Server`'s `server_init_callback`."""
    from tvm.rpc import server

    serving = server._serving
    if getattr(serving, "keeps_serving", False):
        return

    def _serving(sock: Any, addr: Any, opts: Any, load_library: Any) -> None:
        cwd = os.getcwd()
        try:
            serving(sock, addr, opts, load_library)
        except RuntimeError as err:  # "Child process ... exited unsuccessfully with error code -11"
            server.logger.warning("session from %s ended abnormally (%s); serving on", addr, err)
            os.chdir(cwd)
            sock.close()

    _serving.keeps_serving = True  # type: ignore[attr-defined]
    server._serving = _serving


def serve(tracker: str, key: str, host: str = "0.0.0.0", port: int = 9090, port_end: int = 9199,
          custom_addr: str | None = None, wait_s: float = 60.0) -> None:
    """Run one TVM RPC server for this machine's device, registered at `tracker` under `key`, until killed."""
    from tvm import rpc

    thost, tport = parse_tracker(tracker)
    deadline = time.monotonic() + wait_s
    while True:  # the tracker may be starting too; after wait_s, one clear line instead of TVM's retries
        try:
            tracker_summary(thost, tport)
            break
        except RPCUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    srv = rpc.Server(host, port, port_end, key=key, tracker_addr=(thost, tport), custom_addr=custom_addr,
                     server_init_callback=keep_serving_after_crash)
    print(f"serving key {key!r} on {host}:{srv.port}, registered at tracker {thost}:{tport}", flush=True)
    srv.proc.join()
