"""jgpt.foundation.validation: every reader refuses what it should, naming the field, and agrees with its schema.

The properties run over jgpt's own document descriptions: a document built to a description
is read back unchanged and validates against the generated JSON Schema; one wrong value
anywhere in it is refused by the reader with that value's dotted path, and by the schema
at that same place (`jsonschema`, an implementation independent of ours).
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction
from pathlib import PurePosixPath

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import (
    LIMIT,
    UNSAFE_PATH,
    Anything,
    Boolean,
    Const,
    Either,
    Integer,
    Integers,
    ListOf,
    MapOf,
    Nullable,
    Number,
    Object,
    Rate,
    RelativePath,
    String,
    Tagged,
    Text,
    integer,
    integers,
    is_integer,
    is_number,
    json_schema,
    mapping,
    number,
    string,
)


def documents():
    """The descriptions of the documents jgpt reads and writes (imported here: collecting stays cheap)."""
    from experiments.experiment_design import LAB
    from inference.measured_run import MEASURED_RUN
    from inference.recorded_computations import WORKLOAD
    from kvsim.cache_run import RECORD
    from kvsim.inputs import INPUT
    from kvsim.recorded import DOCUMENT

    return {"recorded-computations": DOCUMENT, "workload": WORKLOAD, "kvsim-input": INPUT, "kvsim-record": RECORD,
            "measured-run": MEASURED_RUN, "lab": LAB}  # fmt: skip


NAMES = ("recorded-computations", "workload", "kvsim-input", "kvsim-record", "measured-run", "lab")


# -- documents built to a description ----------------------------------------------------------------------------


@functools.singledispatch
def valid(description) -> st.SearchStrategy:
    raise TypeError(f"no strategy for {description!r}")


@valid.register
def _(d: Integer):
    return st.integers(-LIMIT if d.minimum is None else d.minimum, LIMIT if d.maximum is None else d.maximum)


@valid.register
def _(d: Number):
    low = 2.0**-40 if d.positive else (-1e6 if d.minimum is None else d.minimum)
    return st.floats(low, 1e6) | st.integers(math.ceil(low), 10**6)


@valid.register
def _(d: Rate):
    return st.integers(1, 10**6) | st.floats(1e-3, 1e6)


@valid.register
def _(d: String):
    if d.choices is not None:
        return st.sampled_from(d.choices)
    if d.pattern is not None:
        return st.from_regex(d.pattern, fullmatch=True).filter(lambda s: s.isascii())
    return st.text(min_size=1 if d.non_empty else 0, max_size=8)


@valid.register
def _(d: Text):
    return st.text(max_size=8).filter(str.strip)


@valid.register
def _(d: RelativePath):
    return st.sampled_from(["a.json", "runs/a/b.json", "x..y", ".hidden"])


@valid.register
def _(d: Const):
    return st.just(d.value)


@valid.register
def _(d: Boolean):
    return st.booleans()


@valid.register
def _(d: Anything):
    return st.none() | st.integers() | st.text(max_size=4)


@valid.register
def _(d: Nullable):
    return st.none() | valid(d.inner)


@valid.register
def _(d: Integers):
    return st.lists(st.integers(d.minimum, min(d.maximum, d.minimum + 10**6)), min_size=d.min_items, max_size=4)


@valid.register
def _(d: ListOf):
    return st.lists(valid(d.item), min_size=d.min_items, max_size=2)


@valid.register
def _(d: MapOf):
    return st.dictionaries(st.text(max_size=4), valid(d.value), max_size=2)


@valid.register
def _(d: Object):
    return st.fixed_dictionaries({k: valid(v) for k, v in d.required.items()},
                                 optional={k: valid(v) for k, v in d.optional.items()})  # fmt: skip


@valid.register
def _(d: Tagged):
    return st.one_of([valid(a).map(lambda v, tag=tag: v | {d.key: tag}) for tag, a in d.alternatives.items()])


@valid.register
def _(d: Either):
    return st.one_of([valid(a) for a in d.alternatives])


# -- one wrong value at a chosen place ---------------------------------------------------------------------------


def places(description, value, path=()):
    """(path, description) of every place in `value` whose description refuses `true`."""
    if isinstance(description, (Anything, Boolean)):
        return []
    found = [(path, description)]
    if isinstance(description, Nullable) and value is not None:
        return found + places(description.inner, value, path)[1:]
    if isinstance(description, Tagged):
        return places(description.alternatives[value[description.key]], value, path)
    if isinstance(description, Either):
        chosen = next(a for a in description.alternatives if _reads(a, value))
        return found + places(chosen, value, path)[1:]
    if isinstance(description, Object):
        known = {**description.required, **description.optional}
        return found + [p for k, v in value.items() for p in places(known[k], v, (*path, k))]
    if isinstance(description, MapOf):
        return found + [p for k, v in value.items() for p in places(description.value, v, (*path, k))]
    if isinstance(description, ListOf):
        return found + [p for i, v in enumerate(value) for p in places(description.item, v, (*path, i))]
    if isinstance(description, Integers):
        return found + [((*path, i), Integer()) for i in range(len(value))]
    return found


def _reads(description, value) -> bool:
    try:
        description.read(value, "document")
        return True
    except ApiError:
        return False


def replaced(value, path, new):
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, list):
        return [replaced(v, rest, new) if i == head else v for i, v in enumerate(value)]
    return {k: replaced(v, rest, new) if k == head else v for k, v in value.items()}


def dotted(path, root="document") -> str:
    return root + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def schema_places(name, document) -> set[str]:
    """Where `jsonschema` finds faults: every error and every error inside an anyOf/oneOf, as dotted paths."""
    found, errors = set(), list(_validator(name).iter_errors(document))
    while errors:
        error = errors.pop()
        found.add(dotted(tuple(error.absolute_path)))
        errors.extend(error.context or ())
    return found


@functools.cache
def _validator(name):
    return jsonschema.Draft202012Validator(json_schema(documents()[name], name, name))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_reader_and_schema_take_a_document_and_refuse_one_wrong_value_at_its_field(name, data):
    description = documents()[name]
    document = data.draw(valid(description))
    assert description.read(document, "document") is not None
    assert schema_places(name, document) == set()
    path, part = data.draw(st.sampled_from(places(description, document)))
    wrong = "x" if isinstance(part, Boolean) else True  # JSON true is no integer, number, string, array or object
    bad = replaced(document, path, wrong)
    with pytest.raises(ApiError) as refused:
        description.read(bad, "document")
    assert refused.value.field == dotted(path)
    assert dotted(path) in schema_places(name, bad)


# -- the readers one by one --------------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=8,
)


@given(JSON, st.integers(-5, 5) | st.none(), st.integers(-5, 5) | st.none())
def test_integer_takes_exactly_the_ints_in_range_never_a_boolean(value, low, high):
    ok = (
        type(value) is int and (low is None or value >= low) and (high is None or value <= high) and abs(value) <= LIMIT
    )
    if ok:
        assert integer(value, "a.b", low, high) == value
    else:
        with pytest.raises(ApiError) as refused:
            integer(value, "a.b", low, high)
        assert refused.value.field == "a.b"


@given(JSON | st.sampled_from([True, False, 1.5, -3, 0, 2**60]))
def test_the_predicates_take_ints_and_floats_never_a_boolean(value):
    # Independent of the implementation: JSON's own types, as json.loads gives them.
    assert is_integer(value) == (type(value) is int)
    assert is_number(value) == (type(value) in (int, float))


@given(JSON)
def test_number_is_finite_exact_and_bounded(value):
    numeric = type(value) in (int, float) and math.isfinite(value) and 0 <= value and Fraction(repr(value)) <= LIMIT
    if numeric:
        assert number(value, "rate") == Fraction(repr(value))
    else:
        with pytest.raises(ApiError) as refused:
            number(value, "rate")
        assert refused.value.field == "rate"


@given(JSON)
def test_string_from_choices(value):
    if value in ("lru", "none") and isinstance(value, str):
        assert string(value, "policy", ("lru", "none")) == value
    else:
        with pytest.raises(ApiError, match="policy"):
            string(value, "policy", ("lru", "none"))


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(), max_size=4))
def test_an_object_names_its_first_unknown_then_its_first_missing_field(value):
    unknown, missing = sorted(set(value) - {"a", "b", "c"}), sorted({"a", "b"} - set(value))
    if not unknown and not missing:
        assert mapping(value, "top", {"a", "b"}, {"c"}) is value
        return
    with pytest.raises(ApiError) as refused:
        mapping(value, "top", {"a", "b"}, {"c"})
    assert refused.value.field == f"top.{(unknown or missing)[0]}"
    assert refused.value.reason == ("unknown field" if unknown else "missing required field")


@given(st.lists(st.integers(-3, 3) | st.booleans(), max_size=6))
def test_integers_names_the_first_bad_entry(values):
    bad = next((i for i, v in enumerate(values) if type(v) is not int or v < 0), None)
    if bad is None:
        assert integers(values, "ids") == values
    else:
        with pytest.raises(ApiError) as refused:
            integers(values, "ids")
        assert refused.value.field == f"ids[{bad}]"


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../b", "a\\b", "a\x00b", "..", " ", ""])
def test_relative_path_refuses_what_would_leave_its_directory(path):
    with pytest.raises(ApiError) as refused:
        RelativePath().read(path, "evidence[0]")
    assert refused.value.field == "evidence[0]"
    assert not jsonschema.Draft202012Validator(RelativePath().schema()).is_valid(path)


@given(st.text(alphabet="ab./\\\x00", max_size=8))
def test_the_unsafe_path_pattern_is_the_pure_path_rule(path):
    """UNSAFE_PATH (one regex: the schemas' and jgpt.foundation.paths.confined's) against pathlib's reading of the path."""
    pure = PurePosixPath(path)
    assert bool(re.search(UNSAFE_PATH, path)) == (
        pure.is_absolute() or ".." in pure.parts or "\\" in path or "\x00" in path
    )


@pytest.mark.parametrize("value", [1.0, 2.5, True, "3", None, 2**53 + 1, -1])
def test_integer_and_its_schema_refuse_the_same_non_integers(value):
    """One documented difference: JSON Schema counts 1.0 as an integer, the reader does not (JSON
    written by jgpt never holds one; kvsim's counts must be exact)."""
    with pytest.raises(ApiError):
        Integer().read(value, "n")
    assert jsonschema.Draft202012Validator(Integer().schema()).is_valid(value) == (
        type(value) is float and value == 1.0
    )


def test_an_empty_field_names_the_top_level_key_alone():
    with pytest.raises(ApiError) as refused:
        Object({"id": String()}).read({"id": 3}, "")
    assert refused.value.field == "id"


def test_tagged_picks_the_alternative_by_its_key_and_default():
    service = Tagged("model", {"roofline": Object({"rate": Rate()}, {"model": String(("roofline",))}),
                               "calibrated": Object({"model": String(("calibrated",)), "terms": Integer()})},
                     default="roofline")  # fmt: skip
    assert service.read({"rate": 2}, "s") == {"rate": Fraction(2)}
    with pytest.raises(ApiError) as refused:
        service.read({"model": "calibrated", "rate": 2}, "s")
    assert refused.value.field == "s.rate"
    with pytest.raises(ApiError) as refused:
        service.read({"model": "fitted"}, "s")
    assert refused.value.field == "s.model"
    validator = jsonschema.Draft202012Validator(service.schema())
    assert validator.is_valid({"rate": 2}) and validator.is_valid({"model": "calibrated", "terms": 1})
    assert not validator.is_valid({"model": "calibrated", "rate": 2})
