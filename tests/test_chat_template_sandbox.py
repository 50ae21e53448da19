"""A foreign chat template is data: whatever it computes, encoding turns with it renders them or is
refused naming `chat_template`, and quickly.

jinja2's sandbox keeps a template from reaching Python, but not from asking for a result sized by a
number: `"a" * 10**10` or `"a"|center(10**10)` exhausted the memory, `9 ** 999999999` held the CPU in
a big-integer power no signal interrupts, and `1/0` or `"%d" % "x"` ended in a traceback.
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jgpt.errors import ApiError
from jgpt.hf_tokenizer import TEMPLATE_SIZE_LIMIT
from jgpt.tokenizer import Tokenizer, Turn
from tests.hostile import FUZZ

FRAMING = "{% for m in messages %}<|endoftext|>{{ m['content'] }}{% endfor %}"
NUMBERS = st.one_of(
    st.integers(-(2**40), 2**40),
    st.sampled_from([0, 1, -1, TEMPLATE_SIZE_LIMIT, TEMPLATE_SIZE_LIMIT + 1, 10**10, 999999999]),
)
METHODS = ("ljust", "rjust", "center", "zfill", "expandtabs")
FILTERS = ("center", "indent", "truncate", "wordwrap", "batch", "slice", "round")


@st.composite
def expressions(draw) -> str:
    """One jinja2 expression that sizes, divides or formats by a drawn number."""
    n, m = draw(NUMBERS), draw(NUMBERS)
    return draw(
        st.sampled_from(
            [
                f'"ab" * {n}',
                f'("ab" * {m}) * {n}',
                f"[1, 2] * {n}",
                f"{m} ** {n}",
                f"{m} / {n}",
                f"{m} // {n}",
                f"{m} % {n}",
                f'"%0{n}d" % 1',
                f'"%.{n}f" % 1.5',
                '"%*d" % ({n}, 1)'.format(n=n),
                '"%d" % "x"',
                '"{{:>{n}}}".format(1)'.format(n=n),
                '"{{:>{{w}}}}".format(1, w={n})'.format(n=n),
                f"range({n})|list|length",
                *(f'"a".{method}({n})' for method in METHODS),
                *(f'"ab"|{name}({n})' for name in FILTERS),
            ]
        )
    )


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from tests.hf_models import gpt2_tokenizer

    directory = tmp_path_factory.mktemp("chat-template")
    (directory / "tokenizer.json").write_text(gpt2_tokenizer().to_str())
    return directory


@FUZZ
@given(expression=expressions(), where=st.sampled_from(["before", "inside"]))
def test_a_chat_template_computing_anything_renders_or_is_refused_naming_it_quickly(tokenizer_dir, expression, where):
    template = (
        f"{{{{ {expression} }}}}{FRAMING}"
        if where == "before"
        else FRAMING.replace("{{ m['content'] }}", f"{{{{ {expression} }}}}{{{{ m['content'] }}}}")
    )
    (tokenizer_dir / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "chat_template": template})
    )
    tokenizer = Tokenizer.load(tokenizer_dir / "tokenizer.json")
    start = time.perf_counter()
    try:
        encoding = tokenizer.encode_turns([Turn("user", "hi"), Turn("assistant", "yo")])
    except ApiError as error:
        assert error.field == "chat_template", error
    else:
        assert len(encoding.ids) <= 4 * TEMPLATE_SIZE_LIMIT + 8  # what one expression may add, twice, in ids
    assert time.perf_counter() - start < 10, "a template's computation was not bounded"


@pytest.mark.parametrize(("expression", "phrase"), [
    ('"a" * 3000000000', "sizes a result by 3000000000"), ('("a" * 60000) * 60000', "sizes a result by 3600000000"),
    ("9 ** 999999999", "raises to the power 999999999"), ('"a"|center(10000000000)', "sizes a result by 10000000000"),
    ('"a".ljust(10000000000)', "sizes a result by 10000000000"), ('"{:>99999999}".format(1)', "formats with a width"),
    ('"%09999999d" % 1', "formats with a width"), ("1 / 0", "ZeroDivisionError"), ('"%s" % ()', "TypeError"),
])  # fmt: skip
def test_the_templates_that_broke_it_are_refused_naming_the_reason(tokenizer_dir, expression, phrase):
    (tokenizer_dir / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "chat_template": f"{{{{ {expression} }}}}{FRAMING}"})
    )
    with pytest.raises(ApiError, match=phrase) as error:
        Tokenizer.load(tokenizer_dir / "tokenizer.json").encode_turns([Turn("user", "hi")])
    assert error.value.field == "chat_template"
