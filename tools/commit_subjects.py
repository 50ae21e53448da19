"""Commit subjects of at most 72 characters, the detail in the body (CONTRIBUTING.md, "Commits").

    python tools/commit_subjects.py                        # every commit since the check's own (make lint, CI)
    python tools/commit_subjects.py --message-file FILE    # one message, as git hands it to .githooks/commit-msg

A subject is what `git log --oneline` shows: the message's first paragraph, its lines joined by spaces (so a
message without a blank line after its first line has its whole first paragraph as the subject).

The base is the commit that added this file, found by its path rather than written down as a hash, so that a
rebase of the branch that carries it moves the base along. The history before it is grandfathered: most of
its subjects are longer. Checked are the base and its descendants up to HEAD (`git rev-list --ancestry-path`):
the commits made where the check already was. A branch forked before the base and merged later keeps its own
commits unchecked (they cannot be reworded once merged); its merge commit is checked.

In a shallow clone the check starts at the oldest commit the clone holds, if the check is in it.

A subject with git's autosquash prefixes (`fixup! `, `squash! `, `amend! `) is measured without them: git
writes them in front of the subject they fix, and `git rebase --autosquash` takes them off again.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

LIMIT = 72
ROOT = Path(__file__).resolve().parents[1]
CHECK = Path(__file__).resolve().relative_to(ROOT).as_posix()
AUTOSQUASH_PREFIXES = ("fixup! ", "squash! ", "amend! ")
ADVICE = f"A subject says what changed in at most {LIMIT} characters; the detail goes in the body, after a blank line"


def git(*arguments: str) -> str:
    """The output of `git -C ROOT ARGUMENTS`; CalledProcessError when git refuses, OSError when there is none."""
    return subprocess.run(("git", "-C", str(ROOT), *arguments), capture_output=True, text=True, check=True).stdout


def measured(subject: str) -> str:
    """The part of a subject held to the limit: the subject without its autosquash prefixes."""
    while subject.startswith(AUTOSQUASH_PREFIXES):
        subject = subject.split(" ", 1)[1]
    return subject


def too_long(subject: str) -> bool:
    return len(measured(subject)) > LIMIT


def subject_of_message(message: str, comment: str) -> str:
    """The subject git will record for a message being committed: what git's clean-up leaves of it (comment lines
    and everything below the scissors line of `commit --verbose` dropped, leading blank lines too), then its first
    paragraph joined as `git log --format=%s` joins it."""
    lines: list[str] = []
    for line in message.splitlines():
        if line.startswith(f"{comment} ------------------------ >8 ------------------------"):
            break
        if not line.startswith(comment):
            lines.append(line.rstrip())
    paragraph: list[str] = []
    for line in lines:
        if line:
            paragraph.append(line)
        elif paragraph:
            break
    return " ".join(paragraph)


def comment_character() -> str:
    """git's core.commentChar, '#' unless it is set to one character ("auto" picks one per message: '#' then)."""
    try:
        configured = git("config", "core.commentChar").strip()
    except (OSError, subprocess.CalledProcessError):
        return "#"
    return configured if len(configured) == 1 else "#"


def check_message(path: Path) -> int:
    subject = subject_of_message(path.read_text(encoding="utf-8", errors="replace"), comment_character())
    if not too_long(subject):
        return 0
    print(
        f"commit-msg: the subject is {len(measured(subject))} characters, at most {LIMIT}: {subject!r}\n"
        f"  {ADVICE}. The message is kept in {path}.",
        file=sys.stderr,
    )
    return 1


def base_commit() -> str | None:
    """The commit that added this file, or None where it is not committed here (the oldest, if it was re-added)."""
    added = git("log", "--full-history", "--diff-filter=A", "--format=%H", "HEAD", "--", CHECK).split()
    return added[-1] if added else None


def check_history() -> int:
    try:
        top = Path(git("rev-parse", "--show-toplevel").strip()).resolve()
    except (OSError, subprocess.CalledProcessError):
        top = None
    if top != ROOT:
        print(f"commit subjects: {ROOT} is not a git checkout (no .git, or no git): no history to check")
        return 0
    base = base_commit()
    if base is None:
        print(f"commit subjects: {CHECK} is not committed yet: no commit carries the check, nothing to check")
        return 0
    listed = git("log", "--ancestry-path", "--format=%H %s", f"{base}..HEAD") + git("log", "-1", "--format=%H %s", base)
    commits = [line.split(" ", 1) for line in listed.splitlines()]
    refused = [
        f"  {commit[:12]} ({len(measured(subject))} characters): {subject}"
        for commit, subject in commits
        if too_long(subject)
    ]
    shallow = git("rev-parse", "--is-shallow-repository").strip() == "true"
    first = "the oldest of this shallow clone to carry the check" if shallow else "the first to carry the check"
    checked = f"{len(commits)} commit{'s' * (len(commits) > 1)} from {base[:12]} ({first}) to HEAD"
    if refused:
        print(f"commit subjects: {len(refused)} of {checked} are over {LIMIT} characters:", *refused, sep="\n")
        print(f"{ADVICE}. Reword them before they merge: git rebase -i {base[:12]}^ (or git commit --amend).")
        return 1
    print(f"commit subjects: {checked}, every subject at most {LIMIT} characters")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--message-file", type=Path, help="check one message (the commit-msg hook's argument)")
    arguments = parser.parse_args(argv)
    return check_message(arguments.message_file) if arguments.message_file else check_history()


if __name__ == "__main__":
    sys.exit(main())
