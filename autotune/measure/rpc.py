"""`--runner rpc://HOST:PORT/KEY`: measure on a farm of devices through TVM's RPC tracker and servers.

The tuner builds here (cross-compiling for the devices' target); each candidate's library is uploaded to a
server registered under KEY, which must be an `autotune rpc server`: TVM's server plus two functions that run
the local runner's code there (`common.measure_here`, the measurement core). The server makes the task's
inputs and reference once per session, then for each candidate calls it once through the user's call path,
compares with the reference and times that same call, so a farm's figures are the local runner's. TVM's
stock server can only time with `time_evaluator` (not what a user's call costs) and is refused with a clear
error. A batch is spread over the servers, one slot per server: each slot is a worker process (TVM's
PopenWorker, so a hung call is killed by a timeout) holding one RPC session for the batch.

Faults cost only the candidates in flight. A session that is lost is attributed with the tracker's help: if
the server is gone from the tracker, the server died and the candidate is measured again on another one (up
to `retries` times); if the server is still registered, the candidate ended its own session (a crash) and is
recorded as such; a candidate whose server died every time it ran is a harness error (a resumed run
measures it again). A candidate that outlasts `timeout` is recorded as a `timeout` and its slot starts a new
session (TVM's server ends the hung one when the session's timeout expires).

TVM's stock server also stops serving after a session process dies abnormally (a segfaulting candidate);
`autotune rpc server` serves on.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from urllib.parse import parse_qs, urlsplit

from ..build import Built, describe_error, last_lines
from ..runtime import HARNESS, Timing
from ..task import Task
from .base import Measured
from .common import call, check_anchor, discard, harness_error, measure_here, say_on_stderr, task_data

DEFAULT_TRACKER_PORT = 9190
# Registered by `autotune rpc server`: names on the wire between tuner and server, not module paths.
PREPARE, MEASURE = "autotune.rpc.prepare", "autotune.rpc.measure"


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
        """`rpc://HOST:PORT/KEY` (port 9190 if omitted), options after a `?` aside (`url_options`)."""
        parts = urlsplit(url)
        key = parts.path.strip("/")
        try:
            port = parts.port or DEFAULT_TRACKER_PORT
        except ValueError:
            port = -1
        if parts.scheme != "rpc" or not parts.hostname or not key or "/" in key or port <= 0:
            raise ValueError(f"bad RPC runner {url!r}; expected rpc://HOST:PORT/KEY, e.g. rpc://127.0.0.1:9190/a100")
        url_options(url)  # a bad option is refused here too
        return cls(parts.hostname, port, key)

    def __str__(self) -> str:
        return f"rpc://{self.host}:{self.port}/{self.key}"


# The runner's options a URL may carry (`rpc://HOST:PORT/KEY?timeout=60`), so that `--runner` and tune_model's
# `runner=` text reach them: a farm of slow devices (or a cold server's first session) needs more than the
# default seconds per candidate.
URL_OPTIONS = {"timeout": float, "prepare_timeout": float, "retries": int, "wait_s": float}


def url_options(url: str) -> dict[str, Any]:
    """The runner options in `url`'s query (`URL_OPTIONS`), typed; an unknown or malformed one is a clear error."""
    out: dict[str, Any] = {}
    for name, values in parse_qs(urlsplit(url).query, keep_blank_values=True).items():
        if name not in URL_OPTIONS:
            raise ValueError(f"unknown option {name!r} in RPC runner {url!r}; known: {', '.join(URL_OPTIONS)}")
        try:
            value = URL_OPTIONS[name](values[-1])
        except ValueError:
            value = -1
        if not value >= 0 or (name == "timeout" and not value > 0):
            raise ValueError(f"bad {name}={values[-1]!r} in RPC runner {url!r}; expected a positive "
                             f"{URL_OPTIONS[name].__name__}")
        out[name] = value
    return out


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
_SESSION: dict[str, Any] = {}  # the worker's open session: sess, its measure function, server, uploads


class StockServer(RPCUnavailable):
    """The server lacks our measure function: it is TVM's stock server, which can only time with time_evaluator
    (not the user's call path), so it is refused rather than measured differently."""


def _open_session(farm: Farm, task: Task, seed: int, session_timeout: float) -> tuple[str, int]:
    """Ask the tracker for a server of the key (waiting while all are busy), connect, and have the server make
    the task's inputs and reference (once per session, within the prepare timeout)."""
    from tvm import rpc
    from tvm.rpc import base

    _close_session()
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
    try:
        prepare, measure = sess.get_function(PREPARE), sess.get_function(MEASURE)
    except Exception:
        raise StockServer(f"the {farm.key!r} server at {url}:{port} is TVM's stock RPC server, which cannot time "
                          f"candidates through the call path users run; start it as `autotune rpc server "
                          f"--tracker {farm.host}:{farm.port} --key {farm.key}` instead") from None
    unprepared = prepare(_request(task, None, Timing(seed=seed))) or None
    _SESSION.update(sess=sess, measure=measure, server=(url, int(port)), uploads=0, unprepared=unprepared)
    return url, int(port)


def _request(task: Task, cfg: Any, timing: Timing) -> bytearray:
    return bytearray(pickle.dumps((task, cfg, timing)))


def _close_session() -> None:
    _SESSION.clear()  # dropping the last reference to the session closes it


def _alive() -> bool:
    try:
        _SESSION["sess"].get_function("tvm.rpc.server.workpath")("probe")
        return True
    except Exception:  # the session is gone
        return False


def _measure_remote(task: Task, cfg: Any, lib: str, timing: Timing) -> tuple[tuple[float, ...], str | None,
                                                                             str | None, str]:
    """(costs, error_kind, error, session status): upload the library, and let the server check and time it."""
    if not _SESSION:
        return (), HARNESS, "no RPC session", "lost"
    if _SESSION["unprepared"]:
        return (), HARNESS, _SESSION["unprepared"], "ok"
    try:
        name = f"c{_SESSION['uploads']}.so"
        _SESSION["uploads"] += 1
        _SESSION["sess"].upload(lib, name)
        costs, kind, msg = json.loads(_SESSION["measure"](name, _request(task, cfg, timing)))
    except Exception as err:  # the session died (the candidate or the server), or our server function failed
        msg = describe_error(err)
        if not _alive():
            _close_session()
            return (), "crash", msg, "lost"
        return (), HARNESS, msg, "ok"
    if kind == "runtime" and task.device.is_gpu:  # a CUDA error poisons the context: a fresh session next
        _close_session()
        return (), kind, msg, "reset"
    return tuple(costs), kind, msg, "ok"


# ---- the tuner's side -----------------------------------------------------------------------------------------
@dataclass
class _Item:
    built: Built
    attempts: int = 0  # times its server went away while it was being measured


class RPCRunner:
    """Measures a batch in parallel on the servers registered under a key at a TVM RPC tracker.

    `timeout`: per candidate (upload, check, timing); `prepare_timeout`: to get a server and make the inputs there;
    `retries`: how often a candidate whose server died is measured again elsewhere; `wait_s`: how long to wait
    for a server when none is registered; `on_dispatch(server, config)` is called as each candidate is sent.
    A URL's options (`rpc://HOST:PORT/KEY?timeout=60`: `URL_OPTIONS`) take the place of the arguments.
    """

    def __init__(self, farm: Farm | str, timing: Timing = Timing(), timeout: float = 30.0,
                 prepare_timeout: float = 600.0, retries: int = 1, max_parallel: int | None = None,
                 wait_s: float = 60.0, say: Callable[[str], None] | None = None,
                 on_dispatch: Callable[[tuple[str, int], Any], None] | None = None):
        check_anchor(timing, gpu=False, runner="the RPC runner")
        self.farm = farm if isinstance(farm, Farm) else Farm.parse(farm)
        given = {} if isinstance(farm, Farm) else url_options(farm)
        self.timing = timing
        self.timeout = given.get("timeout", timeout)
        self.prepare_timeout = given.get("prepare_timeout", prepare_timeout)
        self.retries = given.get("retries", retries)
        self.max_parallel = max_parallel
        self.wait_s = given.get("wait_s", wait_s)
        self.say = say or say_on_stderr
        self.on_dispatch = on_dispatch
        self._workers: list[Any] = []
        self._refused: list[StockServer] = []
        self.summary()  # an unreachable tracker fails here, before anything is built

    def summary(self) -> dict[str, Any]:
        return tracker_summary(self.farm.host, self.farm.port)

    def _worker(self, i: int) -> Any:
        from tvm.support.popen_pool import PopenWorker

        while len(self._workers) <= i:
            self._workers.append(PopenWorker())
        return self._workers[i]

    def measure(self, task: Task, built: Sequence[Built]) -> list[Measured]:
        done: dict[int, Measured] = {id(b): Measured.unbuilt(b) for b in built if b.lib is None}
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
                if self._refused:
                    raise self._refused[0]
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
                    discard(b.lib)
        return [done[id(b)] for b in built]

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
                    server = call(worker, _open_session, (self.farm, task, self.timing.seed, session_timeout),
                                  self.prepare_timeout)
                    opened += 1
                except StockServer as err:  # refused for the whole run: `measure` raises it
                    self._refused.append(err)
                    break
                except Exception as err:  # no server within prepare_timeout, or it died while we connected
                    self.say(f"rpc: could not open a session on a {self.farm.key} server: {last_lines(str(err), 1)}")
                    break
            with lock:
                if not queue:
                    break
                item = queue.popleft()
            b = item.built
            if self.on_dispatch is not None:
                self.on_dispatch(server, b.config)
            try:
                costs, kind, msg, status = call(worker, _measure_remote, (task, b.config, b.lib, self.timing),
                                                 self.timeout)
            except TimeoutError:
                done[id(b)] = Measured(b, (), "timeout", f"no result from {_addr(server)} within "
                                                         f"{self.timeout:.0f} s (hang?)")
                server = None  # the worker was killed; TVM's server ends the session at its timeout
                continue
            except ChildProcessError:
                costs, kind, msg, status = (), "crash", "the measure worker died", "lost"
            except Exception as err:  # raised in the worker outside the kernel
                costs, kind, msg, status = (), HARNESS, harness_error(err, "the RPC measure worker failed"), "ok"
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
                    done[id(b)] = Measured(b, (), HARNESS, f"its RPC server went away each of the "
                                                           f"{item.attempts + 1} times it ran: {msg}")
                continue
            if status == "reset":
                server = None
            done[id(b)] = Measured(b, tuple(costs), kind, msg)
        if server is not None:
            try:
                call(worker, _close_session, (), 30.0)
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


# ---- `autotune rpc server`: TVM's server with the measurement core, kept serving after a crash ---------------
def _serve_prepare(request: bytes) -> str:
    """Make the task's inputs and reference in this session's process: "" or why it failed (a harness error)."""
    task, _, timing = pickle.loads(request)
    try:
        task_data(task, timing.seed)
    except Exception as err:
        return harness_error(err, "making the task's inputs on the RPC server failed")
    return ""


def _serve_measure(lib_name: str, request: bytes) -> str:
    """Check and time an uploaded candidate here with the local runner's code; JSON [costs, error_kind, error]."""
    import tvm_ffi

    task, cfg, timing = pickle.loads(request)
    path = tvm_ffi.get_global_func("tvm.rpc.server.workpath")(lib_name)
    return json.dumps(measure_here(task, cfg, path, timing))


def server_init() -> None:
    """Runs in the server's process before it serves (`tvm.rpc.Server`'s `server_init_callback`): registers
    the measure functions, which each session's process inherits, and keeps serving after a crash."""
    import tvm_ffi

    tvm_ffi.register_global_func(PREPARE, _serve_prepare, override=True)
    tvm_ffi.register_global_func(MEASURE, _serve_measure, override=True)
    keep_serving_after_crash()


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
                     server_init_callback=server_init)
    print(f"serving key {key!r} on {host}:{srv.port}, registered at tracker {thost}:{tport}", flush=True)
    srv.proc.join()
