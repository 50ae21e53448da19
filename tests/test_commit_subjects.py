"""tools/commit_subjects.py and .githooks/commit-msg, on a throwaway git repository that carries copies of both."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBJECT_72 = "x" * 72
SUBJECT_73 = "y" * 73


def run(repository: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=repository, capture_output=True, text=True, env=git_environment(repository))


def git_environment(repository: Path) -> dict[str, str]:
    """git as a fresh user sees it: no global or system configuration, no repository above the throwaway one."""
    return {
        **os.environ,
        "HOME": str(repository.parent),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CEILING_DIRECTORIES": str(repository.parent),
        "GIT_AUTHOR_NAME": "A",
        "GIT_AUTHOR_EMAIL": "a@example.org",
        "GIT_COMMITTER_NAME": "A",
        "GIT_COMMITTER_EMAIL": "a@example.org",
    }


def git(repository: Path, *arguments: str) -> str:
    done = run(repository, "git", *arguments)
    assert done.returncode == 0, done.stderr
    return done.stdout


def commit(repository: Path, message: str) -> None:
    git(repository, "commit", "--allow-empty", "--no-verify", "-q", "-m", message)


def check(repository: Path) -> subprocess.CompletedProcess[str]:
    return run(repository, sys.executable, "tools/commit_subjects.py")


def carry_check(repository: Path) -> None:
    """Copy the check and its hook into `repository` and commit them: that commit is the base."""
    for relative in ("tools/commit_subjects.py", ".githooks/commit-msg"):
        (repository / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, repository / relative)
    git(repository, "add", ".")
    commit(repository, "tools/commit_subjects.py: subjects of at most 72 characters")


@pytest.fixture
def repository(tmp_path) -> Path:
    """A repository whose history has a long subject before the check came in (grandfathered), then the check."""
    repository = tmp_path / "repository"
    repository.mkdir()
    git(repository, "init", "-q", "-b", "main")
    commit(repository, "an old commit from before the rule, " + "with a long subject " * 4)
    carry_check(repository)
    return repository


def test_the_history_before_the_check_is_grandfathered(repository):
    done = check(repository)
    assert done.returncode == 0, done.stdout
    assert "1 commit from" in done.stdout


def test_a_subject_of_72_characters_is_accepted_and_73_refused(repository):
    commit(repository, SUBJECT_72 + "\n\nThe detail, in a body line that is much longer than the subject may be, " * 2)
    assert check(repository).returncode == 0
    commit(repository, SUBJECT_73)
    done = check(repository)
    assert done.returncode == 1
    assert f"(73 characters): {SUBJECT_73}" in done.stdout
    assert "1 of 3 commits" in done.stdout


def test_an_empty_body_is_fine_and_a_first_paragraph_is_one_subject(repository):
    commit(repository, "a subject and no body")
    assert check(repository).returncode == 0
    # No blank line after the first line: git's subject is the whole first paragraph, joined by a space.
    commit(repository, "x" * 40 + "\n" + "y" * 32)
    done = check(repository)
    assert done.returncode == 1
    assert "(73 characters)" in done.stdout


def test_a_fixup_is_measured_without_its_prefix(repository):
    commit(repository, SUBJECT_72)
    commit(repository, "fixup! " + SUBJECT_72)
    commit(repository, "squash! fixup! " + SUBJECT_72)
    assert check(repository).returncode == 0
    commit(repository, "fixup! " + SUBJECT_73)
    assert check(repository).returncode == 1


def test_a_merge_commit_is_checked_but_not_the_old_commits_it_brings(repository):
    # A branch forked before the check, with a long subject, merged after it: its commit is grandfathered.
    git(repository, "checkout", "-q", "-b", "old", "HEAD~1")
    commit(repository, "an old branch's commit, " + "long " * 20)
    git(repository, "checkout", "-q", "main")
    git(repository, "merge", "-q", "--no-ff", "--no-verify", "old", "-m", "Merge branch 'old'")
    done = check(repository)
    assert done.returncode == 0, done.stdout
    assert "2 commits from" in done.stdout
    git(repository, "checkout", "-q", "-b", "side", "HEAD~1")
    commit(repository, "a side commit")
    git(repository, "checkout", "-q", "main")
    git(repository, "merge", "-q", "--no-ff", "--no-verify", "side", "-m", "Merge " + "z" * 70)
    done = check(repository)
    assert done.returncode == 1
    assert "(76 characters): Merge zzz" in done.stdout


def test_the_hook_refuses_73_characters_before_the_commit_is_made(repository):
    git(repository, "config", "core.hooksPath", ".githooks")
    head = git(repository, "rev-parse", "HEAD")
    refused = run(repository, "git", "commit", "--allow-empty", "-m", SUBJECT_73 + "\n\nbody")
    assert refused.returncode != 0
    assert "the subject is 73 characters, at most 72" in refused.stderr
    assert git(repository, "rev-parse", "HEAD") == head
    for accepted in (SUBJECT_72, SUBJECT_72 + "\n\nbody", "fixup! " + SUBJECT_72):
        done = run(repository, "git", "commit", "--allow-empty", "-m", accepted)
        assert done.returncode == 0, done.stderr
    assert check(repository).returncode == 0


def test_a_merge_goes_through_the_hook_too(repository):
    git(repository, "config", "core.hooksPath", ".githooks")
    git(repository, "checkout", "-q", "-b", "side")
    commit(repository, "a side commit")
    git(repository, "checkout", "-q", "main")
    refused = run(repository, "git", "merge", "--no-ff", "side", "-m", "Merge " + "z" * 70)
    assert refused.returncode != 0
    assert "the subject is 76 characters" in refused.stderr
    run(repository, "git", "merge", "--abort")
    done = run(repository, "git", "merge", "--no-ff", "side", "-m", "Merge branch 'side'")
    assert done.returncode == 0, done.stderr


def test_the_hook_reads_the_message_as_git_will_record_it(tmp_path):
    """Comment lines and the scissors section of `commit --verbose` are not the subject; leading blank lines
    are dropped (git's clean-up), so the first written line is."""
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text(
        "\n\n" + SUBJECT_72 + "\n\nbody\n# Please enter the commit message " + "z" * 80 + "\n"
        "# ------------------------ >8 ------------------------\n" + "diff " * 40 + "\n"
    )
    done = run(tmp_path, sys.executable, str(ROOT / "tools/commit_subjects.py"), "--message-file", str(message))
    assert done.returncode == 0, done.stderr
    message.write_text("# a comment first\n" + SUBJECT_73 + "\n")
    done = run(tmp_path, sys.executable, str(ROOT / "tools/commit_subjects.py"), "--message-file", str(message))
    assert done.returncode == 1


def test_a_shallow_clone_checks_the_commits_it_holds(repository, tmp_path):
    commit(repository, SUBJECT_72)
    commit(repository, SUBJECT_73)
    commit(repository, SUBJECT_72)
    clone = tmp_path / "clone"
    git(repository, "clone", "-q", "--depth", "2", repository.as_uri(), str(clone))
    done = check(clone)
    assert done.returncode == 1
    assert "1 of 2 commits" in done.stdout and "shallow clone" in done.stdout
    git(repository, "clone", "-q", "--depth", "1", repository.as_uri(), str(tmp_path / "tip"))
    assert check(tmp_path / "tip").returncode == 0


def test_without_git_history_it_passes_and_says_why(tmp_path):
    unpacked = tmp_path / "unpacked"
    (unpacked / "tools").mkdir(parents=True)
    shutil.copy2(ROOT / "tools/commit_subjects.py", unpacked / "tools/commit_subjects.py")
    done = check(unpacked)
    assert done.returncode == 0
    assert "is not a git checkout" in done.stdout


def test_a_repository_that_has_not_committed_the_check_passes_and_says_why(tmp_path):
    repository = tmp_path / "repository"
    repository.mkdir()
    git(repository, "init", "-q", "-b", "main")
    commit(repository, SUBJECT_73)
    (repository / "tools").mkdir()
    shutil.copy2(ROOT / "tools/commit_subjects.py", repository / "tools/commit_subjects.py")
    done = check(repository)
    assert done.returncode == 0
    assert "is not committed yet" in done.stdout
