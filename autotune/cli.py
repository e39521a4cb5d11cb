"""`autotune list|tune|featurize|best|bench|export|check|rpc`. User errors print one line and exit 2; bugs keep their traceback."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

import search_spaces
from cost_model import TRANSFER_AS, TUNE_FEATURE_SETS
from cost_model.features import AUTO, describe_feature_sets
from search_spaces import InvalidConfig, UnknownOperator, WorkloadError

from autotune.check import DEFAULT_CASES, DEFAULT_TIMEOUT_S
from autotune.inspect_cache import skip_moduleless_frames
from autotune.measure.rpc import RPCUnavailable
from autotune.records import ERROR_KINDS
from autotune.search import STRATEGIES
from autotune.tuning_log import TuningLog, existing_paths

STALE_HELP = "use records of older template code too (their kernels may differ from what the code generates now)"
USER_ERRORS = (UnknownOperator, WorkloadError, InvalidConfig, FileNotFoundError, LookupError, ValueError,
               RPCUnavailable)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autotune", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    ls = sub.add_parser("list", help="operators, their workload fields and knobs")
    ls.add_argument("--device", default="cpu", help="whose knobs to show: cpu, cuda:sm_90, ...")

    def task_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("op", help="operator name (see `autotune list`)")
        sp.add_argument("--device", default="cpu",
                        help="cpu (this machine), cpu:MCPU, cuda (the local GPU) or cuda:sm_80|sm_89|sm_90")
        sp.add_argument("--shape", required=True, help="workload, e.g. rows=1000000,dim=64,batch=2048,pooling=20-80")

    t = sub.add_parser("tune", help="tune one operator on one device")
    task_args(t)
    t.add_argument("--trials", type=int, default=64)
    t.add_argument("--log", help="JSON-lines log to append to (and resume from); required unless --dry-run")
    t.add_argument("--strategy", choices=tuple(STRATEGIES), default="xgb",
                   help="; ".join(s.describe(options=False) for s in STRATEGIES.values()))
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--batch-size", type=int, default=None, help="configs per batch (default: the strategy's)")
    t.add_argument("--features", choices=TUNE_FEATURE_SETS, default=AUTO,
                   help="what the cost model sees: " + describe_feature_sets())
    t.add_argument("--transfer", metavar="LOG", action="append", default=None,
                   help="logs whose records warm the cost model up (repeatable; default: the shipped logs)")
    t.add_argument("--no-transfer", action="store_true", help="start the cost model from this log alone")
    t.add_argument("--transfer-as", choices=TRANSFER_AS, default="pooled",
                   help="prior: a model of the transferred records scores first and this task's records correct "
                        "it; pooled: one model of all records")
    t.add_argument("--early-stopping", type=int, default=None, help="stop after N trials without improvement")
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("--runner", default="local",
                   help="local (this machine's CPU or GPU), offline:DIR (write batches to DIR, measured there "
                        "by `python DIR/measure.py`) or rpc://HOST:PORT/KEY (the servers registered under KEY at "
                        "a TVM RPC tracker, in parallel; ?timeout=S&retries=N set its limits)")
    t.add_argument("--include-stale", action="store_true", help="count records of older template code as measured "
                                                                 "(they are re-measured otherwise)")
    t.add_argument("--retry-errors", metavar="KIND[,KIND]", default="",
                   help="measure again the configs whose records failed with these error kinds "
                        "(" + ", ".join(ERROR_KINDS) + ")")
    t.add_argument("--anchor", action="store_true",
                   help="time each candidate's repeats between repeats of the default config and correct them by "
                        "its drift: twice the time, for shared machines whose speed swings (CPU, local runner)")
    t.add_argument("--dry-run", action="store_true",
                   help="build the first --trials candidates and show them; measure nothing, write no log")

    fz = sub.add_parser("featurize", help="add program features (cost_model.program) to the records of logs "
                                          "that lack them, rewriting each log atomically")
    fz.add_argument("logs", nargs="+", metavar="LOG")
    fz.add_argument("--workers", type=int, default=2, help="lowering worker processes")
    fz.add_argument("--include-stale", action="store_true",
                    help="featurize records of older template code too (today's lowering of their configs)")

    b = sub.add_parser("best", help="the best record of a log, per task")
    b.add_argument("--log", required=True)
    b.add_argument("--include-stale", action="store_true", help=STALE_HELP)

    be = sub.add_parser("bench", help="best logged kernel vs PyTorch vs untuned default, side by side")
    task_args(be)
    be.add_argument("--log", required=True, action="append", help="log(s) to take the best kernel from")
    be.add_argument("--seed", type=int, default=0)
    be.add_argument("--include-stale", action="store_true", help=STALE_HELP)
    be.add_argument("--json", action="store_true", help="print one JSON object")
    be.add_argument("--rounds", type=int, default=3, help="interleaved rounds of timing (medians are reported)")
    be.add_argument("--no-roofline", action="store_true", help="skip the roofline microbenchmark")

    ex = sub.add_parser("export", help="the best kernel per task of logs -> a package runnable without TVM")
    ex.add_argument("--log", required=True, action="append", help="log(s) to take the best kernels from")
    ex.add_argument("--out", required=True, help="package directory to write")
    ex.add_argument("--device", action="append", help="only these devices (default: all in the logs)")
    ex.add_argument("--include-stale", action="store_true", help=STALE_HELP)
    ex.add_argument("--bench", action="store_true",
                    help="time each kernel of this machine's devices against PyTorch (as `autotune bench`) and "
                         "record the speed-up in the manifest (null without it)")

    ck = sub.add_parser("check", help="each kernel of a package vs PyTorch on this machine (CI): exit 1 names "
                                      "the first failing case")
    ck.add_argument("package", help="package directory written by `autotune export`")
    ck.add_argument("--cases", type=int, default=DEFAULT_CASES, help="random cases per kernel (edge cases come "
                                                                     "on top)")
    ck.add_argument("--seed", type=int, help="reproduce a run's random cases (default: fresh, printed)")
    ck.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help="seconds per kernel before it counts as hung")
    ck.add_argument("--json", action="store_true", help="print one JSON object")

    r = sub.add_parser("rpc", help="device farms through TVM's RPC tracker")
    rsub = r.add_subparsers(dest="rpc_command", required=True)
    rs = rsub.add_parser("status", help="servers, and per key how many are free and how many requests wait")
    rs.add_argument("--tracker", required=True, help="HOST:PORT of the tracker")
    rv = rsub.add_parser("server", help="serve this machine's device to a tracker (TVM's RPC server, kept "
                                        "serving after a candidate crashes its session)")
    rv.add_argument("--tracker", required=True, help="HOST:PORT of the tracker")
    rv.add_argument("--key", required=True, help="device kind, the KEY of rpc://HOST:PORT/KEY")
    rv.add_argument("--host", default="0.0.0.0", help="address to listen on")
    rv.add_argument("--port", type=int, default=9090, help="first port to try")
    rv.add_argument("--port-end", type=int, default=9199, help="last port to try")
    rv.add_argument("--custom-addr", help="address to report to the tracker (if not the one it sees)")
    return p


def _list(device: str) -> None:
    from autotune.targets import resolve
    from search_spaces.template import device_kinds

    dev = resolve(device)
    target = dev.target()
    for name in search_spaces.names():
        tpl = search_spaces.get(name)
        print(f"{name}: {tpl.DOC}")
        print("  --shape keys: " + ", ".join(tpl.Workload.shape_keys()))
        if ("cuda" if dev.is_gpu else "cpu") not in device_kinds(tpl):
            print(f"  no kernels on {dev.name}: it runs on {', '.join(device_kinds(tpl))} only")
            continue
        print(f"  knobs on {dev.name} (for --shape {tpl.EXAMPLE_SHAPE}):")
        for line in tpl.space(tpl.Workload.from_shape(tpl.EXAMPLE_SHAPE), target).describe():
            print(f"    {line}")


def _dry_run(args: argparse.Namespace, task: object) -> None:
    from autotune.tuner import dry_run

    built = dry_run(task, args.trials, seed=args.seed)  # type: ignore[arg-type]
    print(f"{args.op} on {task.device.name}: the first {len(built)} candidates (built, not measured)")  # type: ignore[attr-defined]
    for b in built:
        status = "ok" if b.lib else f"{b.error_kind}: {b.error}"
        usage = "; ".join(f"{k.name} {k.threads} threads {k.registers} regs {k.shared_bytes} B smem"
                          + (f" {k.spill_bytes} B spilled" if k.spill_bytes else "") for k in b.usage)
        print(f"  {b.config}\n    {status}  ({b.build_s:.1f} s){'  ' + usage if usage else ''}")


def _tune(args: argparse.Namespace) -> None:
    from autotune.measure import Timing, make_runner
    from autotune.task import make_task
    from autotune.tuner import tune

    task = make_task(args.op, args.device, shape=args.shape)
    if args.dry_run:
        return _dry_run(args, task)
    if not args.log:
        raise ValueError("--log is required (or --dry-run)")
    timing = Timing(anchor=args.anchor)
    runner = make_runner(args.runner, timing)
    try:
        res = tune(task, trials=args.trials, log=args.log, strategy=args.strategy, seed=args.seed, timing=timing,
                   batch_size=args.batch_size, early_stopping=args.early_stopping, progress=not args.no_progress,
                   runner=runner, include_stale=args.include_stale, features=args.features,
                   transfer=() if args.no_transfer else args.transfer, transfer_as=args.transfer_as,
                   retry_errors=[k.strip() for k in args.retry_errors.split(",") if k.strip()])
    finally:
        if runner is not None:
            runner.close()
    print(f"measured {res.measured} new configs ({res.resumed} were already in {args.log})")
    if res.best is None:
        print("no candidate ran correctly; see the error kinds in the log")
        return
    print(f"best: {res.best.latency * 1e3:.3f} ms  config {json.dumps(res.best.config, sort_keys=True)}")


def _featurize(args: argparse.Namespace) -> None:
    from autotune.build import Builder
    from autotune.featurize import add_program_features
    from cost_model.program import PROGRAM_FEATURES_VERSION

    existing_paths(args.logs)
    if args.workers < 1:
        raise ValueError("--workers must be >= 1")
    with Builder(workers=args.workers) as builder:
        for log in args.logs:
            n = add_program_features(log, builder, include_stale=args.include_stale)
            every = TuningLog(log).records
            have = sum(1 for r in every if r.features and r.features_version == PROGRAM_FEATURES_VERSION)
            print(f"{log}: {n} records gained program features; {have} of {len(every)} carry them")


def _best(args: argparse.Namespace) -> None:
    log = TuningLog.existing(args.log)
    if not log.tasks():
        print(f"{args.log}: no records")
    for key in log.tasks():
        op, wkey, dev = key
        mine = log.current(key, args.include_stale)
        stale = len(log.stale(key, args.include_stale))
        b = log.best(key, args.include_stale)
        failed = sum(1 for r in mine if not r.ok)
        head = f"{op} on {dev} {wkey}: {len(mine)} records, {failed} failed"
        if stale:
            head += f"; {stale} stale records ignored (older template code; --include-stale uses them)"
        print(head if b is None else f"{head}\n  best {b.latency * 1e3:.3f} ms  {json.dumps(b.config, sort_keys=True)}")


def _bench(args: argparse.Namespace) -> None:
    from autotune.bench import bench, format_result
    from autotune.task import make_task

    task = make_task(args.op, args.device, shape=args.shape)
    res = bench(task, args.log, seed=args.seed, rounds=args.rounds, roof=not args.no_roofline,
                include_stale=args.include_stale)
    if res.roof is None and not args.no_roofline:
        print(f"autotune bench: no roofline line: {res.roof_error}", file=sys.stderr)
    print(json.dumps(res.to_json()) if args.json else format_result(task, res))


def _export(args: argparse.Namespace) -> None:
    from autotune.package import export

    log = TuningLog.existing(args.log)
    best = [b for key in log.tasks() if (not args.device or key.device in args.device)
            and (b := log.best(key, args.include_stale)) is not None]
    if not best:
        stale = sum(len(log.stale(key, args.include_stale)) for key in log.tasks())
        raise LookupError("no correct records to export in " + ", ".join(args.log)
                          + (f" ({stale} stale records of older template code ignored; --include-stale uses them)"
                             if stale else ""))
    speedups = _speedups(best, log, args.include_stale) if args.bench else None
    manifest = export(best, args.out, speedups=speedups)
    for e in manifest["kernels"]:
        speed = f", {e['speedup_vs_torch']:.2f}x PyTorch" if e.get("speedup_vs_torch") else ""
        print(f"{e['file']}: {e['op']} on {e['device']} {e['workload_key']} ({e['latency_s'] * 1e3:.3f} ms{speed})")
    print(f"wrote {args.out}: {len(manifest['kernels'])} kernels; runs with PyTorch + apache-tvm-ffi")


def _speedups(best: list, log: TuningLog, include_stale: bool) -> dict[tuple[str, str, str], float]:
    """Speed-up over PyTorch of each record whose device is this machine's (others cannot be timed here)."""
    from autotune.bench import bench
    from autotune.targets import UnknownDevice, resolve
    from autotune.task import make_task

    local = {"cpu": resolve("cpu").name}
    try:
        local["cuda"] = resolve("cuda").name
    except UnknownDevice:
        pass
    out = {}
    for rec in best:
        if rec.device not in local.values():
            continue
        task = make_task(rec.op, rec.device, workload=search_spaces.get(rec.op).Workload.from_json(rec.workload))
        out[rec.task] = bench(task, log, include_stale=include_stale).speedup_vs_torch
    return out


def _check(args: argparse.Namespace) -> int:
    from autotune.check import check

    report = check(args.package, cases=args.cases, seed=args.seed, timeout=args.timeout)
    print(json.dumps(report.to_json()) if args.json else report.format())
    return 0 if report.ok else 1


def _rpc(args: argparse.Namespace) -> None:
    from autotune.measure import rpc

    if args.rpc_command == "status":
        print(rpc.status_text(*rpc.parse_tracker(args.tracker)))
    else:
        rpc.serve(args.tracker, args.key, host=args.host, port=args.port, port_end=args.port_end,
                  custom_addr=args.custom_addr)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    skip_moduleless_frames()  # `python -m autotune.cli` lowers under <frozen runpy> frames: see inspect_cache
    try:
        rc = {"list": lambda: _list(args.device), "tune": lambda: _tune(args), "best": lambda: _best(args),
              "featurize": lambda: _featurize(args),
              "bench": lambda: _bench(args), "export": lambda: _export(args),
              "rpc": lambda: _rpc(args), "check": lambda: _check(args)}[args.command]()
    except USER_ERRORS as err:
        print(f"autotune {args.command}: error: {err}", file=sys.stderr)
        return 2
    return rc or 0  # `check` returns 1 when a kernel fails


if __name__ == "__main__":
    sys.exit(main())
