"""jgpt.foundation.json_input: bounded nesting, finite numbers, one ApiError naming the field."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given

from jgpt.foundation.errors import ApiError
from jgpt.foundation.json_input import DEPTH_LIMIT, parse_json, read_json

from hostile import FUZZ, deep_json, hostile_json, json_values


@FUZZ
@given(json_values(max_leaves=20))
def test_parse_json_returns_what_json_loads_does_for_finite_documents(value):
    text = json.dumps(value)
    assert parse_json(text.encode(), "field") == json.loads(text)


@FUZZ
@given(deep_json())
def test_parse_json_refuses_deep_nesting_naming_the_field(data):
    with pytest.raises(ApiError, match="nests deeper than 64 levels") as error:
        parse_json(data, "turns", source="chat.json")
    assert error.value.field == "turns" and "chat.json" in error.value.reason


def test_the_depth_limit_is_inclusive_and_brackets_inside_strings_do_not_count():
    at_limit = "[" * DEPTH_LIMIT + "]" * DEPTH_LIMIT
    assert parse_json(at_limit, "f") == json.loads(at_limit)
    with pytest.raises(ApiError, match="deeper"):
        parse_json("[" + at_limit + "]", "f")
    text = json.dumps({"text": "[{" * 1000 + '\\"' + "]" * 3})
    assert parse_json(text, "f") == json.loads(text)


@pytest.mark.parametrize("lexeme", ["NaN", "Infinity", "-Infinity", "1e999", "-2e400"])
def test_non_finite_numbers_are_refused_unless_the_caller_allows_them(lexeme):
    with pytest.raises(ApiError, match="finite number") as error:
        parse_json(f'{{"epsilon": [{lexeme}]}}', "config")
    assert error.value.field == "config" and lexeme in error.value.reason
    allowed = parse_json(f"[{lexeme}]", "config", allow_non_finite=True)[0]
    assert not math.isfinite(allowed)


@FUZZ
@given(hostile_json())
def test_parse_json_raises_only_api_error_on_hostile_bytes(data):
    try:
        parse_json(data, "field")
    except ApiError as error:
        assert error.field == "field" and "\n" not in str(error)


def test_read_json_names_a_missing_file_and_bad_utf8(tmp_path):
    with pytest.raises(ApiError, match="cannot read"):
        read_json(tmp_path / "missing.json", "workload")
    (tmp_path / "latin1.json").write_bytes(b'"caf\xe9"')
    with pytest.raises(ApiError, match=r"not valid UTF-8.*0xE9") as error:
        read_json(tmp_path / "latin1.json", "workload")
    assert error.value.field == "workload"
