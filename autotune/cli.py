"""`autotune list|tune|best|bench`. User errors print one line and exit 2; bugs keep their traceback."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import search_spaces
from search_spaces import InvalidConfig, UnknownOperator, WorkloadError

USER_ERRORS = (UnknownOperator, WorkloadError, InvalidConfig, FileNotFoundError, LookupError, ValueError)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autotune", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("list", help="operators, their workload fields and knobs")

    def task_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("op", help="operator name (see `autotune list`)")
        sp.add_argument("--device", default="cpu", help="cpu (this machine) or cpu:MCPU")
        sp.add_argument("--shape", required=True, help="workload, e.g. rows=1000000,dim=64,batch=2048,pooling=20-80")

    t = sub.add_parser("tune", help="tune one operator on one device")
    task_args(t)
    t.add_argument("--trials", type=int, default=64)
    t.add_argument("--log", required=True, help="JSON-lines log to append to (and resume from)")
    t.add_argument("--strategy", choices=("xgb", "random"), default="xgb")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--early-stopping", type=int, default=None, help="stop after N trials without improvement")
    t.add_argument("--no-progress", action="store_true")

    b = sub.add_parser("best", help="the best record of a log, per task")
    b.add_argument("--log", required=True)

    be = sub.add_parser("bench", help="best logged kernel vs PyTorch vs untuned default, side by side")
    task_args(be)
    be.add_argument("--log", required=True, action="append", help="log(s) to take the best kernel from")
    be.add_argument("--seed", type=int, default=0)
    be.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _list() -> None:
    from autotune.targets import resolve

    target = resolve("cpu").target()
    for name in search_spaces.names():
        tpl = search_spaces.get(name)
        print(f"{name}: {tpl.DOC}")
        print("  --shape keys: " + ", ".join(tpl.Workload.shape_keys()))
        print(f"  knobs on {target.attrs['mcpu']} (for --shape {tpl.EXAMPLE_SHAPE}):")
        for line in tpl.space(tpl.Workload.from_shape(tpl.EXAMPLE_SHAPE), target).describe():
            print(f"    {line}")


def _tune(args: argparse.Namespace) -> None:
    from autotune.task import make_task
    from autotune.tuner import tune

    task = make_task(args.op, args.device, shape=args.shape)
    res = tune(task, trials=args.trials, log=args.log, strategy=args.strategy, seed=args.seed,
               batch_size=args.batch_size, early_stopping=args.early_stopping, progress=not args.no_progress)
    print(f"measured {res.measured} new configs ({res.resumed} were already in {args.log})")
    if res.best is None:
        print("no candidate ran correctly; see the error kinds in the log")
        return
    print(f"best: {res.best.latency * 1e3:.3f} ms  config {json.dumps(res.best.config, sort_keys=True)}")


def _best(args: argparse.Namespace) -> None:
    from autotune import records

    if not Path(args.log).exists():
        raise FileNotFoundError(f"log not found: {args.log}")
    recs = list(records.load(args.log))
    tasks = sorted({r.task for r in recs})
    if not tasks:
        print(f"{args.log}: no records")
    for op, wkey, dev in tasks:
        mine = records.for_task(recs, op, wkey, dev)
        b = records.best(mine, op, wkey, dev)
        failed = sum(1 for r in mine if not r.ok)
        head = f"{op} on {dev} {wkey}: {len(mine)} records, {failed} failed"
        print(head if b is None else f"{head}\n  best {b.latency * 1e3:.3f} ms  {json.dumps(b.config, sort_keys=True)}")


def _bench(args: argparse.Namespace) -> None:
    from autotune.bench import bench, format_result
    from autotune.task import make_task

    task = make_task(args.op, args.device, shape=args.shape)
    res = bench(task, args.log, seed=args.seed)
    print(json.dumps(res.to_json()) if args.json else format_result(task, res))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        {"list": lambda: _list(), "tune": lambda: _tune(args), "best": lambda: _best(args),
         "bench": lambda: _bench(args)}[args.command]()
    except USER_ERRORS as err:
        print(f"autotune {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
