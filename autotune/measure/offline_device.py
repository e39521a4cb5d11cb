"""Measure candidate batches written by `autotune tune --runner offline:DIR`, on a machine without TVM.

Copied into DIR as `measure.py`; run it on the device (PyTorch + `apache-tvm-ffi` needed, nothing else):

    python DIR/measure.py            # measure every batch in DIR that has no results yet
    python DIR/measure.py --watch    # keep measuring batches as the tuner writes them (shared directory)

Each candidate is run once through the user's call path and compared with the PyTorch reference before that
call is timed, exactly as the local runner does (same code: autotune_runtime.measure_file). A candidate that crashes the process takes only itself: the
script runs each batch in a child process and marks the candidate it was on as crashed when it dies.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

BATCH, RESULTS, PROGRESS = "batch.json", "results.json", "progress.json"
IN_PROGRESS = "being measured"  # the outcome on record while a candidate runs: if the process dies, it is to blame


def write_json(path: Path, obj: object) -> None:
    """Write `obj` to `path` atomically (a reader on either side sees the old file or the whole new one)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _config(raw: dict) -> object:
    from search_spaces.space import Config

    return Config(tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in raw.items()))


def measure_batch(batch_dir: Path) -> None:
    """Measure one batch in this process, recording progress so a crash can be blamed on its candidate."""
    import autotune_runtime as rt
    import search_spaces

    spec = json.loads((batch_dir / BATCH).read_text())
    gpu = spec["gpu"]
    device = "cuda" if gpu else "cpu"
    rt.load_runtime(str(HERE / "lib"), cuda=gpu)
    template = search_spaces.get(spec["op"])
    workload = template.Workload.from_json(spec["workload"])
    timing = rt.Timing(**spec["timing"])
    l2 = rt.l2_bytes_here(spec.get("l2_bytes", 0)) if gpu else 0
    progress_file = batch_dir / PROGRESS
    done = json.loads(progress_file.read_text()) if progress_file.exists() else {}
    try:
        data = rt.TaskData(template, workload, spec["seed"], device)
    except Exception as err:  # the harness's failure: no candidate is to blame, a resumed run measures them
        msg = f"making the task's inputs failed: {type(err).__name__}: {err}"[:500]
        done.update({str(c["id"]): {"costs": [], "error_kind": rt.HARNESS, "error": msg} for c in spec["candidates"]
                     if str(c["id"]) not in done})
        write_json(progress_file, done)
        return
    for cand in spec["candidates"]:
        cid = str(cand["id"])
        if cid in done:
            continue
        done[cid] = {"costs": [], "error_kind": "crash", "error": IN_PROGRESS}
        write_json(progress_file, done)  # if we die now, this candidate is the one to blame
        try:
            costs, kind, msg = rt.measure_file(data, _config(cand["config"]), str(batch_dir / cand["file"]),
                                               timing, l2)
        except Exception as err:  # raised outside the kernel: this script's failure, not the candidate's
            costs, kind, msg = (), rt.HARNESS, f"{type(err).__name__}: {err}"[:500]
        done[cid] = {"costs": list(costs), "error_kind": kind, "error": msg}
        write_json(progress_file, done)


def run_batch(batch_dir: Path, timeout: float, prepare_timeout: float = 600.0) -> None:
    """Measure a batch in child processes until every candidate has an outcome, then publish results.json.

    `timeout` bounds one candidate, from the moment the child records it as being measured; starting the child
    and making the task's data get `prepare_timeout`. (A limit on the whole child would blame whichever
    candidate happened to run when a slow but healthy batch ran out of time.)"""
    import autotune_runtime as rt

    while True:
        spec = json.loads((batch_dir / BATCH).read_text())
        outcome = _run_child(batch_dir, timeout, prepare_timeout)
        if outcome == "timeout":
            _blame_current(batch_dir, "timeout", f"no result within {timeout:.0f} s (hang?)")
        elif outcome:
            _blame_current(batch_dir, "crash", f"the measuring process died (exit {outcome})")
        progress = json.loads((batch_dir / PROGRESS).read_text()) if (batch_dir / PROGRESS).exists() else {}
        if outcome is None or len(progress) >= len(spec["candidates"]):
            break
    results = [dict(id=c["id"], **progress.get(str(c["id"]), {"costs": [], "error_kind": rt.HARNESS,
                                                               "error": "not measured"}))
               for c in spec["candidates"]]
    write_json(batch_dir / RESULTS, {"format": 1, "results": results, "host": os.uname().nodename})


def _run_child(batch_dir: Path, timeout: float, prepare_timeout: float) -> int | str | None:
    """Run one child measuring the batch: None once it finished, its exit status if it died, "timeout" if it was
    killed. The child rewrites the progress file as each candidate starts and ends, so the time since that
    file's last write, while a candidate is marked in progress, is how long that candidate has run."""
    progress_file = batch_dir / PROGRESS
    proc = subprocess.Popen([sys.executable, __file__, "--one", str(batch_dir)])
    started = time.time()
    while True:
        try:
            code = proc.wait(timeout=0.1)
            return None if code == 0 else code
        except subprocess.TimeoutExpired:
            pass
        try:
            since = max(started, progress_file.stat().st_mtime)
            running = any(r.get("error") == IN_PROGRESS for r in json.loads(progress_file.read_text()).values())
        except (OSError, ValueError):  # not written yet (or, on a shared file system, mid-copy)
            since, running = started, False
        if time.time() - since > (timeout if running else prepare_timeout):
            proc.kill()
            proc.wait()
            return "timeout"


def _blame_current(batch_dir: Path, kind: str, msg: str) -> None:
    progress_file = batch_dir / PROGRESS
    if not progress_file.exists():
        return
    done = json.loads(progress_file.read_text())
    for cid, res in done.items():
        if res["error"] == IN_PROGRESS:
            done[cid] = {"costs": [], "error_kind": kind, "error": msg}
    write_json(progress_file, done)


def pending(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob(f"batch-*/{BATCH}") if not (p.parent / RESULTS).exists())


def _seconds(text: str) -> float:
    """A positive number of seconds (argparse type): a zero or negative limit would blame every candidate."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--watch", action="store_true", help="keep measuring new batches until interrupted")
    p.add_argument("--timeout", type=_seconds, default=60.0, help="seconds one candidate may run before it counts as "
                   "hung (starting up and making the task's data do not count)")
    p.add_argument("--prepare-timeout", type=_seconds, default=600.0,
                   help="seconds the measuring process may take to start and make the task's data")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one batch in this process
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE))  # the package's autotune_runtime.py and search_spaces/
    import importlib.util

    missing = [m for m in ("tvm_ffi", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"measure.py: needs {' and '.join(missing)} here: pip install "
              + " ".join({"tvm_ffi": "apache-tvm-ffi==0.1.14.post1", "torch": "torch"}[m] for m in missing),
              file=sys.stderr)
        return 2
    if args.one:
        measure_batch(Path(args.one))
        return 0
    while True:
        for batch in pending(HERE):
            print(f"measuring {batch.name}", flush=True)
            run_batch(batch, args.timeout, args.prepare_timeout)
        if not args.watch:
            return 0
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
