"""Fingerprints of the code records name: each record's config lowered by the templates here, hashed.

A maintainer's proof for `records.retag`: after a change to a template's code, run this over the shipped logs
at the old commit and at the new one; where every record's fingerprint is equal, the change left the
generated code (the scheduled TIR, before LLVM or NVCC) unchanged and the records may be retagged. Lowering
needs no device, so CUDA records are proven on a CPU machine too.

    python -m autotune.lowered logs/cpu/qmatmul.jsonl logs/cuda/qmatmul.jsonl > new.txt

`--specialized` proves a change that makes a size a kernel argument (qmatmul's CPU kernels take their number
of tasks): each module is simplified, and where its template has `scalar_args(workload, config)` (the trailing
integer arguments of a call at the tuned workload) those parameters are first bound to them, so the new
kernel at the records' workload is compared with the old one (run the same file at both commits).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from typing import Any, Iterable, Iterator

from . import records
from .tuning_log import existing_paths


def fingerprints(paths: Iterable[str | os.PathLike[str]], ops: set[str] | None = None,
                 specialized: bool = False) -> Iterator[tuple[str, str]]:
    """(record identity, fingerprint) for each parsed record of `paths` (of `ops`, if given): the identity is
    op, device, workload and config keys; the fingerprint a hash of its lowered module printed as TVMScript, or
    `invalid: <why>` where the config no longer lowers (or its operator is gone). A path that is no file is
    refused (FileNotFoundError naming it): an empty answer would prove nothing."""
    import search_spaces
    from search_spaces.template import target_from_json

    for path in existing_paths(paths):
        for r in records.load(path):
            if ops is not None and r.op not in ops:
                continue
            ident = f"{r.op} {r.device} {r.workload_key} {r.config_key}"
            try:
                template = search_spaces.get(r.op)
                w = template.Workload.from_json(r.workload)
                target = target_from_json(r.target)
                cfg = template.space(w, target).from_json(r.config)
                mod = template.lower(w, cfg, target)
                if specialized:
                    mod = _specialized(mod, getattr(template, "scalar_args", None), w, cfg)
                yield ident, hashlib.sha256(mod.script().encode()).hexdigest()[:16]
            except Exception as e:  # noqa: BLE001 - a config the code no longer takes is part of the answer
                yield ident, f"invalid: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


def _specialized(mod: Any, scalar_args: Any, w: Any, cfg: Any) -> Any:
    """`mod` simplified, its main's trailing scalar parameters first bound to `scalar_args(w, cfg)`."""
    import tvm

    func = mod["main"]
    values = tuple(scalar_args(w, cfg)) if scalar_args is not None else ()
    if values:
        params = list(func.params)[-len(values):]
        func = func.specialize(dict(zip(params, values)))
    return tvm.tirx.transform.StmtSimplify()(tvm.IRModule({"main": func}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotune.lowered", description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+")
    parser.add_argument("--op", action="append", help="only these operators (repeatable)")
    parser.add_argument("--specialized", action="store_true",
                        help="simplified modules, integer arguments bound at the records' workload (see above)")
    args = parser.parse_args(argv)
    try:
        existing_paths(args.logs)
    except FileNotFoundError as e:
        parser.exit(2, f"python -m autotune.lowered: {e}\n")
    seen: set[str] = set()
    for ident, fp in fingerprints(args.logs, set(args.op) if args.op else None, args.specialized):
        if ident not in seen:  # a config measured twice is one line
            seen.add(ident)
            sys.stdout.write(f"{ident}\t{fp}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
