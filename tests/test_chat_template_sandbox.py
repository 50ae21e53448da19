"""A foreign chat template is data: whatever it computes, loading the tokenizer (which renders it once)
and encoding turns with it render them or are refused naming `chat_template`, and quickly.

jinja2's sandbox keeps a template from reaching Python, but not from asking for a result sized by a
number: `"a" * 10**10` or `"a"|center(10**10)` exhausted the memory, `9 ** 999999999` held the CPU in
a big-integer power no signal interrupts, and `1/0` or `"%d" % "x"` ended in a traceback. The template
now renders in the sandbox process (jgpt.tokenizers.sandbox), whose memory, CPU time, wall clock and output are
bounded by the kernel and the parent, whatever the template computes.
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jgpt.foundation.errors import ApiError
from jgpt.tokenizers.framing import Turn
from jgpt.tokenizers.sandbox import CPU_SECONDS, OUTPUT_LIMIT, WALL_SECONDS
from jgpt.tokenizers.tokenizer_file import load_tokenizer
from tests.hostile import FUZZ

FRAMING = "{% for m in messages %}<|endoftext|>{{ m['content'] }}{% endfor %}"
NUMBERS = st.one_of(
    st.integers(-(2**40), 2**40),
    st.sampled_from([0, 1, -1, 1 << 16, (1 << 16) + 1, OUTPUT_LIMIT, OUTPUT_LIMIT + 1, 10**10, 999999999]),
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


@pytest.fixture
def one_cpu_second(monkeypatch):
    """The fuzz tests' CPU bound: one second, so that the cases that exceed it stay cheap."""
    from jgpt.tokenizers import sandbox

    monkeypatch.setattr(sandbox, "CPU_SECONDS", 1)


@FUZZ
@given(expression=expressions(), where=st.sampled_from(["before", "inside"]))
def test_a_chat_template_computing_anything_renders_or_is_refused_naming_it_quickly(
    tokenizer_dir, one_cpu_second, expression, where
):
    template = (
        f"{{{{ {expression} }}}}{FRAMING}"
        if where == "before"
        else FRAMING.replace("{{ m['content'] }}", f"{{{{ {expression} }}}}{{{{ m['content'] }}}}")
    )
    (tokenizer_dir / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "chat_template": template})
    )
    start = time.perf_counter()
    try:
        tokenizer = load_tokenizer(tokenizer_dir / "tokenizer.json")
        encoding = tokenizer.encode_turns([Turn("user", "hi"), Turn("assistant", "yo")])
    except ApiError as error:
        assert error.field == "chat_template", error
    else:
        assert len(encoding.ids) <= 4 * OUTPUT_LIMIT + 8  # a byte-level id per byte of the framing, 4 a character
    # Three renders (two at load), each within the wall-clock bound, and the sandbox process's restart.
    assert time.perf_counter() - start < 3 * WALL_SECONDS + 10, "a template's computation was not bounded"


MEMORY, CPU, OUTPUT = (
    "needs more than 256 MiB of memory",
    f"takes more than ({CPU_SECONDS} s of CPU|{WALL_SECONDS} s)",
    f"renders more than {OUTPUT_LIMIT} characters",
)


@pytest.mark.parametrize(("expression", "phrase"), [
    ('"a" * 3000000000', MEMORY), ('("a" * 60000) * 60000', MEMORY), ("9 ** 999999999", CPU),
    ('"a"|center(10000000000)', MEMORY), ('"a".ljust(10000000000)', MEMORY), ('"{:>99999999}".format(1)', OUTPUT),
    ('"%09999999d" % 1', OUTPUT), ("1 / 0", "ZeroDivisionError"), ('"%s" % ()', "TypeError"),
])  # fmt: skip
def test_the_templates_that_broke_it_are_refused_naming_the_reason(tokenizer_dir, expression, phrase):
    (tokenizer_dir / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "chat_template": f"{{{{ {expression} }}}}{FRAMING}"})
    )
    with pytest.raises(ApiError, match=phrase) as error:
        load_tokenizer(tokenizer_dir / "tokenizer.json")
    assert error.value.field == "chat_template" and "tokenizer_config.json:chat_template" in error.value.reason
