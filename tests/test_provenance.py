"""A run's stamp (commit, CPU, date, command) and the README block it is pasted into: only a summary of a run at
the README's own code (documents aside) goes in."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from autotune import provenance


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@t")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / "README.md").write_text("# x\n\n<!-- BEGIN whole-model -->\nold table\n<!-- END whole-model -->\n\nrest\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "one")
    return tmp_path


def summary(repo: Path, body: str = "| a | b |") -> Path:
    s = provenance.stamp("cpu:znver4", ["python", "examples/dlrm.py", "--trials", "8"], root=repo)
    path = repo / "summary.md"
    path.write_text(provenance.stamped(s, body))
    return path


def test_a_stamp_names_the_commit_cpu_date_and_command_and_reads_back(repo):
    s = provenance.stamp("cpu:znver4", ["python", "examples/dlrm.py", "--log-dir", "a b"], root=repo)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert (s.commit, s.dirty, s.cpu) == (head, False, "cpu:znver4")
    assert s.command == "python examples/dlrm.py --log-dir 'a b'"
    text = provenance.stamped(s, "| t |")
    assert provenance.read_stamp(text) == s
    assert f"commit `{head}`" in text.splitlines()[1] and text.rstrip().endswith("| t |")
    (repo / "code.py").write_text("x = 2\n")
    assert provenance.stamp("cpu:znver4", ["x"], root=repo).dirty
    with pytest.raises(ValueError, match="not a stamped summary"):
        provenance.read_stamp("| a table |\n")


def test_a_scripts_command_is_written_as_run_with_python(repo):
    assert provenance.stamp("cpu:x", ["examples/dlrm.py", "--trials", "8"], root=repo).command == \
        "python examples/dlrm.py --trials 8"


def test_a_summary_of_a_commit_this_checkout_lacks_is_refused_by_name(repo):
    path = summary(repo)
    text = path.read_text()
    head = provenance.read_stamp(text).commit
    path.write_text(text.replace(head, "0123456789ab", 1))
    with pytest.raises(SystemExit, match="the run's commit 0123456789ab is not in the history of"):
        provenance.main([str(path), str(repo / "README.md")])


def test_outside_git_the_commit_is_unknown(tmp_path):
    assert provenance.stamp("cpu:x", ["y"], root=tmp_path).commit == "unknown"


def test_a_summary_of_this_code_is_pasted_into_its_block_and_documents_and_tests_may_differ(repo):
    path = summary(repo, "| new | table |")
    (repo / "NOTES.md").write_text("a document changed since the run\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_x.py").write_text("a test too\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "docs")
    provenance.main([str(path), str(repo / "README.md")])
    text = (repo / "README.md").read_text()
    assert "old table" not in text and "| new | table |" in text and text.endswith("<!-- END whole-model -->\n\nrest\n")
    provenance.paste(path, repo / "README.md")  # again: the block is replaced, not added to
    assert (repo / "README.md").read_text().count("| new | table |") == 1


def test_a_summary_of_other_code_or_a_dirty_checkout_is_refused_and_the_readme_kept(repo, capsys):
    readme = (repo / "README.md").read_text()
    (repo / "code.py").write_text("x = 2\n")
    dirty = summary(repo)
    with pytest.raises(SystemExit, match="uncommitted code"):
        provenance.main([str(dirty), str(repo / "README.md")])
    git(repo, "checkout", "code.py")
    path = summary(repo)
    (repo / "code.py").write_text("x = 3\n")
    git(repo, "commit", "-qam", "code")
    with pytest.raises(SystemExit, match=r"the code changed since \(code.py\): run it again"):
        provenance.main([str(path), str(repo / "README.md")])
    (repo / "bare.md").write_text("no stamp\n")
    with pytest.raises(SystemExit, match="not a stamped summary"):
        provenance.main([str(repo / "bare.md"), str(repo / "README.md")])
    assert (repo / "README.md").read_text() == readme


def test_a_readme_without_the_block_is_refused(repo):
    (repo / "README.md").write_text("# no block\n")
    git(repo, "commit", "-qam", "drop the block")
    with pytest.raises(ValueError, match="no `<!-- BEGIN whole-model -->`"):
        provenance.paste(summary(repo), repo / "README.md")
