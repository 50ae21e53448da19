"""Hostile input for any jgpt command: run it in-process and check it refused cleanly.

`assert_refused(argv, inputs=..., watch=...)` runs `jgpt.cli.main(argv)` with stdout and
stderr captured and asserts what issue 13 promises of every refusal: exit 2, exactly one
error line (after argparse's usage block, if argparse refused), no traceback, every input
file byte-identical, and nothing new in the watched directories (no half-written output,
no temporary file).

`assert_clean(argv, ...)` is for input that may be valid: the command either exits with
an accepted code or refuses as above; inputs are untouched either way.

The hypothesis strategies build the input: `hostile_json()` (wrong types, deep nesting,
non-finite or oversized numbers, random bytes), `mutated_json(document)` (a valid
document with one value replaced by something hostile, a key deleted, or a hostile member
added: an empty key, a lone surrogate, terminal escapes),
`extreme_numbers()` (finite numbers at and past the edges), and
`hostile_outputs(root, input)` (a directory, a missing parent, a file as parent, the
input itself, a link to the input).

`JGPT_FUZZ_EXAMPLES` sets the examples per entry point (`FUZZ`; default 200, the CI
size; a nightly run uses e.g. JGPT_FUZZ_EXAMPLES=5000).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from jgpt.cli import main as cli


@contextlib.contextmanager
def interruptible():
    """SIGINT with its default handler while a test sends it. A suite started in the background (`make test &`
    from a script) or in an xdist worker inherits SIGINT ignored, and a command honours an ignored signal as
    nohup asks; a test of the command's own handling sets it as a terminal would."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


FUZZ = settings(
    max_examples=int(os.environ.get("JGPT_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def run_jgpt(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `jgpt ARGV` run in this process; an escaping exception fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(arg) for arg in argv])
        except SystemExit as exit_:  # argparse
            code = exit_.code if isinstance(exit_.code, int) else 2
        except Exception:
            raise AssertionError(f"jgpt {' '.join(map(str, argv))} raised:\n{traceback.format_exc()}") from None
    return code, out.getvalue(), err.getvalue()


def error_lines(stderr: str) -> list[str]:
    """The lines of stderr after argparse's usage block (which argparse prints before its one error line)."""
    lines = stderr.splitlines()
    if lines and lines[0].startswith("usage:"):
        lines = [line for line in lines if ": error: " in line]
    return lines


def snapshot(directories: Iterable[str | os.PathLike]) -> dict[str, frozenset[str]]:
    """Every path under each directory, so a test can tell that nothing was left behind."""
    return {
        str(d): frozenset(str(p.relative_to(d)) for p in Path(d).rglob("*")) if Path(d).is_dir() else frozenset()
        for d in directories
    }


def contents(inputs: Iterable[str | os.PathLike]) -> dict[str, bytes | None]:
    return {str(p): Path(p).read_bytes() if Path(p).is_file() else None for p in inputs}


def assert_refused(
    argv: list,
    *,
    inputs: Iterable[str | os.PathLike] = (),
    watch: Iterable[str | os.PathLike] = (),
    field: str | None = None,
) -> str:
    """Run `jgpt ARGV` and assert a clean refusal; returns the one error line.

    `inputs`: files that must be byte-identical afterwards. `watch`: directories that must
    hold the same paths afterwards (the output's directory). `field`: text the error line must name.
    """
    inputs, watch = list(inputs), list(watch)
    before, listed = contents(inputs), snapshot(watch)
    code, stdout, stderr = run_jgpt(argv)
    shown = f"jgpt {' '.join(map(str, argv))}\nexit {code}\nstdout: {stdout[-2000:]}\nstderr: {stderr[-2000:]}"
    assert "Traceback" not in stderr + stdout, shown
    lines = error_lines(stderr)
    assert code == 2, shown
    assert len(lines) == 1 and ": error: " in lines[0], shown
    if field is not None:
        assert field in lines[0], f"the error does not name {field!r}\n{shown}"
    assert contents(inputs) == before, f"an input changed\n{shown}"
    assert snapshot(watch) == listed, f"files left behind: {_difference(listed, snapshot(watch))}\n{shown}"
    return lines[0]


def assert_clean(
    argv: list,
    *,
    inputs: Iterable[str | os.PathLike] = (),
    watch: Iterable[str | os.PathLike] = (),
    accepted: tuple[int, ...] = (0,),
) -> int:
    """Run `jgpt ARGV` on input that may or may not be valid: either an `accepted` exit code, or a
    clean refusal (as `assert_refused`). No traceback and untouched inputs either way; returns the code."""
    inputs, watch = list(inputs), list(watch)
    before, listed = contents(inputs), snapshot(watch)
    code, stdout, stderr = run_jgpt(argv)
    shown = f"jgpt {' '.join(map(str, argv))}\nexit {code}\nstdout: {stdout[-2000:]}\nstderr: {stderr[-2000:]}"
    assert "Traceback" not in stderr + stdout, shown
    assert contents(inputs) == before, f"an input changed\n{shown}"
    if code in accepted:
        return code
    lines = error_lines(stderr)
    assert code == 2 and len(lines) == 1 and _FIELD.search(lines[0]), shown
    assert snapshot(watch) == listed, f"files left behind: {_difference(listed, snapshot(watch))}\n{shown}"
    return code


# `jgpt CMD: error: FIELD: reason`, or argparse's `jgpt CMD: error: argument ...`
_FIELD = re.compile(r"^jgpt [a-z-]+: error: \S.*?: \S")


def _difference(before: dict[str, frozenset[str]], after: dict[str, frozenset[str]]) -> dict[str, list[str]]:
    return {d: sorted(after[d] ^ before[d]) for d in before if after[d] != before[d]}


# -- hypothesis strategies ------------------------------------------------------------------


def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Any finite JSON value: as a replacement it is almost always of the wrong type somewhere."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=12)
        | st.sampled_from(HOSTILE_SCALARS)
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
        max_leaves=max_leaves,
    )


HOSTILE_SCALARS = (
    -1,
    0,
    1,
    -(2**63),
    2**63,
    10**30,
    1e308,
    -1e308,
    5e-324,
    -0.0,
    0.5,
    "",
    " ",
    "-1",
    "NaN",
    "../outside",
    "/etc/passwd",
    "<script>alert(1)</script>",
    "\u2028",
    "\x00",
    "a" * 300,
    "\ud800",
    "x\udfff",
    "\u202etxt.exe",
    "\ufeff",
    "\x1b]0;title\x07",
    "javascript:alert(1)",
    "$\\frac{$",
)
# Keys a mutation may add to an object: empty, a lone surrogate, terminal escapes, one far too long.
HOSTILE_KEYS = ("", " ", "\ud800", "\x00", "\x1b[2J", "__proto__", "k" * 300)


def deep_json() -> st.SearchStrategy[bytes]:
    """Nesting past any reasonable limit, closed or not: crashed every reader with RecursionError."""
    return st.builds(
        lambda depth, opener, closed: opener * depth + (b"1" + _closer(opener) * depth if closed else b""),
        st.integers(65, 100_000),
        st.sampled_from([b"[", b'{"a":']),
        st.booleans(),
    )


def _closer(opener: bytes) -> bytes:
    return b"]" if opener == b"[" else b"}"


NON_FINITE = (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e400", b"1" * 5000)


def hostile_lexemes() -> st.SearchStrategy[bytes]:
    """Raw JSON text for one value: a wrong type, too deep, or a number that is not finite or too long."""
    return st.one_of(
        json_values().map(lambda value: json.dumps(value).encode()), deep_json(), st.sampled_from(NON_FINITE)
    )


def hostile_json() -> st.SearchStrategy[bytes]:
    """A whole hostile file: any hostile value, random bytes, or broken JSON."""
    return st.one_of(
        hostile_lexemes(),
        st.binary(max_size=200),
        st.sampled_from([b"", b"{", b'{"a": 1,}', b"\xef\xbb\xbf{}", b'"\\ud800"', b"[1] [2]"]),
    )


_SENTINEL = "\u0000hostile\u0000"
_DELETE = object()


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [prefix] + [path for key, child in children for path in _paths(child, prefix + (key,))]


def _replace(value: Any, path: tuple, replacement: Any) -> Any:
    if not path:
        return replacement
    key, rest = path[0], path[1:]
    if isinstance(value, dict):
        copy = dict(value)
        if not rest and replacement is _DELETE:
            del copy[key]
        else:
            copy[key] = _replace(value[key], rest, replacement)
        return copy
    copy = list(value)
    if not rest and replacement is _DELETE:
        del copy[key]
    else:
        copy[key] = _replace(value[key], rest, replacement)
    return copy


@st.composite
def mutated_json(
    draw,
    document: Any,
    where=lambda path, value: True,
    wrong_type: bool = False,
    replacements: st.SearchStrategy[bytes] | None = None,
) -> bytes:
    """`document` with one value replaced by hostile JSON text, one member deleted, or one added to an object.

    `where(path, value)` chooses which values may change (a path is a tuple of keys and indices);
    `wrong_type` replaces a value only by one of another JSON type (never null, which may be
    allowed), so that the result is surely invalid for a reader that checks types;
    `replacements` draws the new JSON text instead.
    """
    path = draw(st.sampled_from([p for p in _paths(document) if where(p, _value_at(document, p))]))
    value = _value_at(document, path)
    if not wrong_type and replacements is None:
        change = draw(st.integers(0, 9))
        if path and change < 2:
            return json.dumps(_replace(document, path, _DELETE)).encode()
        if isinstance(value, dict) and change == 2:  # a member no reader expects
            key = draw(st.one_of(st.sampled_from(HOSTILE_KEYS), st.text(max_size=6)).filter(lambda k: k not in value))
            text = json.dumps(_replace(document, path, {**value, key: _SENTINEL})).encode()
            return text.replace(json.dumps(_SENTINEL).encode(), draw(hostile_lexemes()), 1)
    text = json.dumps(_replace(document, path, _SENTINEL)).encode()
    if replacements is None:
        replacements = _other_type(value) if wrong_type else hostile_lexemes()
    lexeme = draw(replacements)
    return text.replace(json.dumps(_SENTINEL).encode(), lexeme, 1)


def extreme_numbers() -> st.SearchStrategy[bytes]:
    """Finite JSON numbers at and past the edges: zero, tiny, 2^53, 1e308, negative."""
    edges = st.sampled_from([0, 1, -1, 2**53, 2**53 + 1, 2**63, 10**30, 1e308, 5e-324, 1e-300, 0.5, -0.0])
    return st.one_of(edges, st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False)).map(
        lambda n: json.dumps(n).encode()
    )


def _value_at(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


def _json_type(value: Any) -> str:
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


def _other_type(original: Any) -> st.SearchStrategy[bytes]:
    same = _json_type(original)
    values = json_values().filter(lambda v: v is not None and _json_type(v) != same)
    return st.one_of(values.map(lambda v: json.dumps(v).encode()), deep_json(), st.sampled_from(NON_FINITE[:5]))


def hostile_outputs(root: Path, input_: Path) -> list[tuple[str, Path]]:
    """Output paths a command must refuse before any work, as (what it is, path); creates them under `root`."""
    directory = root / "a-directory"
    directory.mkdir(exist_ok=True)
    link = root / "link-to-input"
    if not link.is_symlink():
        link.symlink_to(input_.resolve())
    return [
        ("a directory", directory),
        ("a missing parent", root / "missing" / "out"),
        ("a file as parent", input_ / "out"),
        ("the input itself", input_),
        ("a link to the input", link),
    ]
