"""The slow tier's lists (tests/conftest.py) name tests and fixtures that exist: a renamed test would otherwise
drop silently into `make check`'s fast tier, and a renamed fixture take its slow users with it."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import SLOW, SLOW_FIXTURES

TESTS = Path(__file__).resolve().parent


def definitions(path: Path) -> dict[str, set[str]]:
    """The module's functions (under "") and each class's methods (under its name)."""
    tree = ast.parse(path.read_text())
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    found = {"": {node.name for node in tree.body if isinstance(node, functions)}}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            found[node.name] = {item.name for item in node.body if isinstance(item, functions)}
    return found


def names_a_test(test: str, defined: dict[str, set[str]]) -> bool:
    """`function` or `Class::method`; chex's variants run a method as `method__with_jit`, `method__without_jit`."""
    owner, _, function = test.rpartition("::")
    methods = defined.get(owner, set())
    return function in methods or function.split("__")[0] in methods


def test_every_slow_test_names_a_test_of_its_file():
    missing = [
        f"{file}::{test}"
        for file, tests in SLOW.items()
        for test in tests
        if not (TESTS / file).is_file() or not names_a_test(test, definitions(TESTS / file))
    ]
    assert missing == [], "tests/conftest.py SLOW names tests that are not there"


def test_every_slow_fixture_is_defined_in_its_file_or_the_conftest():
    shared = definitions(TESTS / "conftest.py")[""]
    missing = [
        f"{file}: {fixture}"
        for file, fixtures in SLOW_FIXTURES.items()
        for fixture in fixtures
        if not (TESTS / file).is_file() or fixture not in definitions(TESTS / file)[""] | shared
    ]
    assert missing == [], "tests/conftest.py SLOW_FIXTURES names fixtures that are not there"
