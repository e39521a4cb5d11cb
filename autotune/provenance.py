"""Where a figure comes from: the commit, the CPU, the date and the command of the run that printed it, and the
README's generated blocks that carry such a run's table.

A run stamps its summary (`stamp()`, `stamped()`); `python -m autotune.provenance SUMMARY [README]` pastes a
stamped summary into the README between `<!-- BEGIN <name> -->` and `<!-- END <name> -->`, refusing a summary
whose run was at other code than the README's checkout (only documents, `*.md`, and tests may differ), so the
README's table is always one run of the code beside it.
"""

from __future__ import annotations

import argparse
import datetime
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

_STAMP = re.compile(r"^<!-- run: commit (?P<commit>[0-9a-f]+)(?P<dirty>\+dirty)? · (?P<cpu>\S+) · (?P<date>\S+) · "
                    r"(?P<command>.*) -->$")


@dataclass(frozen=True)
class Stamp:
    """The run a figure comes from."""

    commit: str  # the checkout's commit; "unknown" outside git
    dirty: bool  # tracked files differed from it
    cpu: str  # the device kind, e.g. cpu:rocketlake
    date: str  # UTC, ISO 8601 to the minute
    command: str

    def comment(self) -> str:
        """The machine-readable first line of a stamped summary (a markdown comment)."""
        return (f"<!-- run: commit {self.commit}{'+dirty' if self.dirty else ''} · {self.cpu} · {self.date} · "
                f"{self.command} -->")

    def sentence(self) -> str:
        """What a reader sees: the run's commit, CPU and date, and the command that reproduces it."""
        dirty = " with uncommitted changes" if self.dirty else ""
        return f"Run at commit `{self.commit}`{dirty} on `{self.cpu}`, {self.date}: `{self.command}`."


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


def stamp(cpu: str, argv: Sequence[str] | None = None, root: str | Path | None = None) -> Stamp:
    """This run's stamp: `root`'s git commit (this package's checkout by default), `cpu` (the device kind the run
    tuned for), the time now and the command line (`sys.argv`)."""
    root = Path(root) if root is not None else Path(__file__).resolve().parent.parent
    try:
        commit = _git(root, "rev-parse", "--short=12", "HEAD")
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", False
    argv = list(sys.argv if argv is None else argv)
    command = shlex.join(["python", *argv] if argv and argv[0].endswith(".py") else argv)  # a script: as run
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    return Stamp(commit, dirty, cpu, now, command)


def stamped(s: Stamp, body: str) -> str:
    """A summary: the stamp's comment, its sentence, then `body` (markdown)."""
    return f"{s.comment()}\n{s.sentence()}\n\n{body.strip()}\n"


def read_stamp(summary: str) -> Stamp:
    """The stamp of a stamped summary; ValueError where its first line is none."""
    first = summary.splitlines()[0] if summary else ""
    m = _STAMP.match(first)
    if m is None:
        raise ValueError("not a stamped summary: its first line is no `<!-- run: commit ... -->` comment")
    return Stamp(m["commit"], bool(m["dirty"]), m["cpu"], m["date"], m["command"])


def replace_block(text: str, name: str, content: str) -> str:
    """`text` with what lies between `<!-- BEGIN name -->` and `<!-- END name -->` replaced by `content`."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"no `{begin}` ... `{end}` block to write into")
    return text[:i + len(begin)] + "\n" + content.strip() + "\n" + text[j:]


def code_changed_since(commit: str, root: str | Path) -> list[str]:
    """The files a run executes (all but documents, `*.md`, and `tests/`) that differ between `commit` and the
    checkout at `root` (its work tree)."""
    try:
        _git(Path(root), "cat-file", "-e", f"{commit}^{{commit}}")
    except subprocess.CalledProcessError:
        raise ValueError(f"the run's commit {commit} is not in the history of {root}: run it in this checkout") \
            from None
    out = _git(Path(root), "diff", "--name-only", commit, "--", ".", ":(exclude)*.md", ":(exclude)tests/**")
    return [line for line in out.splitlines() if line]


def paste(summary_path: str | Path, readme: str | Path, name: str = "whole-model") -> Stamp:
    """Write the stamped summary into `readme`'s `name` block, if its run was at the code `readme` sits beside."""
    summary = Path(summary_path).read_text()
    s = read_stamp(summary)
    root = Path(readme).resolve().parent
    if s.dirty or s.commit == "unknown":
        raise ValueError(f"{summary_path}: the run was at uncommitted code ({s.commit}{'+dirty' * s.dirty}); "
                         "figures in the README come from a committed checkout")
    changed = code_changed_since(s.commit, root)
    if changed:
        raise ValueError(f"{summary_path}: the run was at {s.commit}, and the code changed since "
                         f"({', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}): run it again")
    Path(readme).write_text(replace_block(Path(readme).read_text(), name, summary))
    return s


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m autotune.provenance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("summary", help="a stamped summary, e.g. logs/local/dlrm/summary.md (make tune writes it)")
    p.add_argument("readme", nargs="?", default="README.md")
    p.add_argument("--block", default="whole-model", help="the README block's name")
    args = p.parse_args(argv)
    try:
        s = paste(args.summary, args.readme, args.block)
    except (OSError, ValueError, subprocess.CalledProcessError) as err:
        sys.exit(f"autotune.provenance: {err}")
    print(f"{args.readme}: block {args.block!r} now holds the run at {s.commit} on {s.cpu}, {s.date}")


if __name__ == "__main__":
    main()
