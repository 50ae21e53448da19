"""Hostile chat templates and tokenizer files: rendered or loaded within documented bounds, or refused.

Before, on the hand-written checks of jgpt.tokenizers.hf_tokenizer's sandbox (a 4 GiB address-space cap kept the
machine alive while reproducing): a format width given as a string (`"{:>{w}}".format(1, w="999999999")`)
rendered 1 GB; products of allowed sizes through replace, join, expandtabs, translate and indent grew
to 0.9 GB at 30,000 x 30,000 (3.6 GB at the allowed 60,000); a tower of `**` and two nested loops over
range(60000) ran until killed (over 40 s); a namespace doubling a string in a loop grew until memory
ran out. Lone surrogates in a template's output or in tokenizer_config.json ended in a TypeError or
UnicodeEncodeError traceback, a bad template was imported and failed at every later command, and a
backtracking pre-tokenizer regex made HF tokenizers panic (`pyo3_runtime.PanicException`) on a text.
"""

from __future__ import annotations

import json
import resource
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jgpt.foundation.errors import ApiError
from jgpt.tokenizers import hf_tokenizer, regex_probe, sandbox
from jgpt.tokenizers.framing import Turn
from jgpt.tokenizers.sandbox import CPU_SECONDS, OUTPUT_LIMIT, WALL_SECONDS
from jgpt.tokenizers.tokenizer_file import load_tokenizer
from tests.hf_models import gpt2_tokenizer, llama_tokenizer
from tests.hostile import FUZZ, assert_refused

EOS = "<|endoftext|>"
FRAMING = "{% for m in messages %}<|endoftext|>{{ m['content'] }}{% endfor %}"
MEMORY = "needs more than 256 MiB of memory"
CPU = f"takes more than ({CPU_SECONDS} s of CPU time|{WALL_SECONDS} s)"
OUTPUT = f"renders more than {OUTPUT_LIMIT} characters"


@pytest.fixture(scope="module")
def gpt2_json() -> dict:
    return json.loads(gpt2_tokenizer().to_str())


@pytest.fixture
def directory(tmp_path, gpt2_json):
    (tmp_path / "tokenizer.json").write_text(json.dumps(gpt2_json))
    return tmp_path


@pytest.fixture
def one_cpu_second(monkeypatch):
    """The fuzz tests' CPU bound: one second, so that the cases that exceed it stay cheap."""
    monkeypatch.setattr(sandbox, "CPU_SECONDS", 1)


def _load(directory, config=None, template=None, spec=None):
    if spec is not None:
        (directory / "tokenizer.json").write_text(json.dumps(spec))
    config = {"eos_token": EOS, **({} if template is None else {"chat_template": template}), **(config or {})}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(directory / "tokenizer.json")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- 1. the bypasses of the old checks, each kept -------------------------------------------------

BYPASSES = {
    "a width as a string, by key": ('{{ "{:>{w}}".format(1, w="999999999") }}', MEMORY),
    "a width as a string, by position": ('{{ "{:>{}}".format(1, "999999999") }}', MEMORY),
    "a %-width as a string": ('{{ "%*d" % ("99999999", 1) }}', "cannot be rendered: TypeError"),
    "replace: a product of allowed sizes": ('{{ ("a" * 60000).replace("a", "b" * 60000) }}', MEMORY),
    "join: a product of allowed sizes": ('{{ ("a" * 60000)|join("b" * 60000) }}', MEMORY),
    "expandtabs: a product of allowed sizes": ('{{ ("\\t" * 60000).expandtabs(60000) }}', MEMORY),
    "translate: a product of allowed sizes": ('{{ ("a" * 60000).translate({97: "b" * 60000}) }}', MEMORY),
    "indent: a product of allowed sizes": ('{{ ("x\\n" * 60000)|indent(60000) }}', MEMORY),
    "a tower of powers": ("{{ ((((9 ** 64) ** 64) ** 64) ** 64) ** 64 }}", CPU),
    "nested loops": ("{% for i in range(60000) %}{% for j in range(60000) %}{% endfor %}{% endfor %}", CPU),
    "a namespace doubling a string": (
        '{% set ns = namespace(s="a") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}',
        MEMORY,
    ),
    "a macro calling itself twice": (
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
        CPU,
    ),
    "a macro without end": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    "an output past the cap": (f'{{{{ "a" * {OUTPUT_LIMIT + 1} }}}}', OUTPUT),
}


@pytest.mark.parametrize("name", BYPASSES)
def test_each_bypass_of_the_old_checks_is_refused_at_load_within_the_bounds(directory, name):
    """Whatever the template computes, this process's memory does not grow and the refusal names chat_template."""
    template, phrase = BYPASSES[name]
    peak, start = _peak_rss_mib(), time.perf_counter()
    with pytest.raises(ApiError, match=phrase) as error:
        _load(directory, template=template + FRAMING)
    assert error.value.field == "chat_template" and "tokenizer_config.json:chat_template" in error.value.reason
    assert time.perf_counter() - start < WALL_SECONDS + 20
    assert _peak_rss_mib() - peak < 64, "the template's memory was allocated in this process"


def test_the_sandbox_process_is_reused_and_replaced_after_it_was_ended(directory):
    tokenizer = _load(directory, template=FRAMING)
    tokenizer.encode_turns([Turn("user", "hi")], open_turn="assistant")
    process = sandbox._CHILD.process
    tokenizer.encode_turns([Turn("user", "hi"), Turn("assistant", "yo")])
    assert sandbox._CHILD.process is process, "one process serves every render"
    with pytest.raises(ApiError, match=CPU):
        _load(directory, template=BYPASSES["nested loops"][0] + FRAMING)
    assert process.poll() is not None, "the process past its CPU time was ended"
    assert len(tokenizer.encode_turns([Turn("user", "hi")]).ids) > 1, "a new one renders the next turn"


def test_a_real_template_renders_per_turn_in_well_under_a_millisecond(directory):
    tokenizer = _load(directory, template=FRAMING + "{% if add_generation_prompt %}<|endoftext|>{% endif %}")
    context = {"messages": [{"role": "user", "content": "x"}] * 8, "add_generation_prompt": True}
    sandbox.render(FRAMING, context, "chat_template")  # started
    start = time.perf_counter()
    for _ in range(50):
        sandbox.render(FRAMING, context, "chat_template")
    assert (time.perf_counter() - start) / 50 < 0.05  # 0.12 ms measured; generous for a loaded machine
    assert tokenizer.encode_turns([Turn("user", "hi")], open_turn="assistant").ids[-1] == tokenizer.eos_id


# ---- 2. characters the library refuses --------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"chat_template": "{{ '\\ud800' }}" + FRAMING}, "chat_template"),  # a literal's escape
        ({"chat_template": "{{ '%c' % 56320 }}" + FRAMING}, "chat_template"),  # computed
        ({"chat_template": "\udc80" + FRAMING}, "chat_template"),  # in the template's own text
        ({"bos_token": "\ud800", "chat_template": "{{ bos_token }}" + FRAMING}, "tokenizer_config.json:bos_token"),
        ({"eos_token": "\ud800"}, "tokenizer_config.json:eos_token"),
    ],
)
def test_a_lone_surrogate_reaching_the_library_is_refused_naming_where_it_came_from(directory, config, field):
    with pytest.raises(ApiError, match="lone surrogate") as error:
        _load(directory, config=config)
    assert error.value.field == field


def test_a_lone_surrogate_in_a_vocabulary_piece_or_added_token_is_refused(tmp_path, gpt2_json):
    llama = json.loads(llama_tokenizer().to_str())
    piece = next(p for p in llama["model"]["vocab"] if len(p) > 2)
    llama["model"]["vocab"]["\ud800"] = llama["model"]["vocab"].pop(piece)
    with pytest.raises(ApiError, match="lone surrogate") as error:
        _load(tmp_path, config={"eos_token": "</s>"}, spec=llama)
    assert error.value.field == "tokenizer"
    for special in (True, False):
        token = {"id": len(gpt2_json["model"]["vocab"]), "content": "\udfff", "special": special}
        with pytest.raises(ApiError, match="lone surrogate") as error:
            _load(tmp_path, spec={**gpt2_json, "added_tokens": [*gpt2_json["added_tokens"], token]})
        assert error.value.field == "tokenizer"


def test_nul_and_other_unusual_characters_encode_as_their_bytes(directory):
    """NUL, noncharacters and a BOM have UTF-8: they are encoded, never refused, in text and in framing."""
    tokenizer = _load(directory, template="\x00" + FRAMING)
    text = "a\x00b\ufffe\ufeff\U0010ffff"
    encoding = tokenizer.encode_turns([Turn("user", text)])
    assert tokenizer.decode(list(encoding.ids)).text == EOS.join(["\x00", text])
    assert tokenizer.decode(tokenizer.encode_text(text)).text == text


@FUZZ
@given(text=st.text(st.characters(codec=None, categories=None), max_size=12))
def test_any_text_encodes_or_is_refused_naming_it(directory, text):
    """Hypothesis's text includes lone surrogates here (codec=None): a refusal, never a TypeError."""
    tokenizer = _load(directory, template=FRAMING)
    for encode in (tokenizer.encode_text, lambda t: tokenizer.encode_turns([Turn("user", t)]).ids):
        try:
            ids = encode(text)
        except ApiError as error:
            assert error.field in ("text", "turns[0].text") and "lone surrogate" in error.reason
        else:
            assert tokenizer.decode(list(ids)).text.endswith(text)


def test_a_surrogate_prompt_on_the_command_line_is_one_line(directory):
    _load(directory, template=FRAMING)
    assert_refused(["tokenize", "--tokenizer", directory / "tokenizer.json", "a\udcffb"], field="lone surrogate")


# ---- 3. the template is rendered when the tokenizer is loaded ----------------------------------------


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    from tests.hf_models import save_model

    root = tmp_path_factory.mktemp("hf-model")
    save_model("gpt2", root / "hf")
    return root / "hf"


@pytest.mark.parametrize(
    "template",
    [
        "{{ raise_exception('Only user turns') }}",  # the template's own refusal
        "{{ messages[0]['content'] }}",  # drops turns after the first
        BYPASSES["nested loops"][0],
        "{% for m in messages %}",  # does not compile
    ],
)
def test_import_hf_refuses_a_template_that_cannot_frame_a_conversation_writing_nothing(hf_model, tmp_path, template):
    (hf_model / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "chat_template": template}))
    out = tmp_path / "artifact"
    line = assert_refused(
        ["import-hf", hf_model, "--out", out], inputs=[hf_model / "tokenizer_config.json"], watch=[tmp_path]
    )
    assert "chat_template" in line and not out.exists(), line


def test_a_chat_template_jinja_file_is_checked_too_and_named(directory):
    (directory / "chat_template.jinja").write_text("{{ 1 / 0 }}")
    with pytest.raises(ApiError, match="ZeroDivisionError") as error:
        _load(directory)
    assert error.value.field == "chat_template" and error.value.reason.startswith("chat_template.jinja ")


# ---- 4. tokenizer regexes ----------------------------------------------------------------------------


def _with_split(spec: dict, pattern, where: str = "pre_tokenizer") -> dict:
    if where == "normalizer":
        return {**spec, "normalizer": {"type": "Replace", "pattern": {"Regex": pattern}, "content": "a"}}
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
    return {**spec, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, spec["pre_tokenizer"]]}}


# Real pre-tokenizer patterns, which must load (GPT-4o's and Llama 3's).
REAL_PATTERNS = [
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]


@pytest.mark.parametrize("pattern", REAL_PATTERNS)
def test_real_pre_tokenizer_patterns_load_and_encode(directory, gpt2_json, pattern):
    start = time.perf_counter()
    tokenizer = _load(directory, spec=_with_split(gpt2_json, pattern))
    assert time.perf_counter() - start < 10
    assert tokenizer.decode(tokenizer.encode_text("It's 2024, isn't it?\n\n")).text == "It's 2024, isn't it?\n\n"


@pytest.mark.parametrize(
    ("pattern", "where", "phrase"),
    [
        ("(a+)+$", "pre_tokenizer", "PanicException: Onig: Regex search error: retry-limit-in-match over"),
        ("(a|aa)+$", "normalizer", "retry-limit-in-match over"),
        ("(x+x+)+y", "pre_tokenizer", "retry-limit-in-match over"),  # on a run of a character it names
        (r"(\s|\p{Z})+$", "pre_tokenizer", "retry-limit-in-match over"),  # on a run of spaces
        ("a" * (regex_probe.REGEX_LIMIT + 1), "pre_tokenizer", "at most 4096 characters"),
        (5, "pre_tokenizer", "a Regex must be valid Unicode text"),
        ("\ud800", "normalizer", "a Regex must be valid Unicode text"),
        ("(", "pre_tokenizer", "Oniguruma error"),
    ],
)
def test_a_pathological_regex_is_refused_when_the_tokenizer_loads(directory, gpt2_json, pattern, where, phrase):
    with pytest.raises(ApiError, match=phrase) as error:
        _load(directory, spec=_with_split(gpt2_json, pattern, where))
    assert error.value.field == "tokenizer"


def test_a_regex_panic_that_escapes_the_probe_is_a_refusal_naming_the_text(directory, gpt2_json, monkeypatch):
    """The library is called narrowly at every use: a panic on a user's text is that text's refusal."""
    monkeypatch.setattr(hf_tokenizer, "check_regexes", lambda spec, source: None)
    tokenizer = _load(directory, template=FRAMING, spec=_with_split(gpt2_json, "(a+)+$"))
    for encode, field in [
        (tokenizer.encode_text, "text"),
        (lambda text: tokenizer.encode_turns([Turn("user", text)]), "turns[0].text"),
    ]:
        with pytest.raises(ApiError, match="PanicException") as error:
            encode("a" * 40 + "!")
        assert error.value.field == field


# ---- 5. fuzz --------------------------------------------------------------------------------------

# Small sizes twice as often as large ones: a case that runs to the CPU bound costs a second and a restart.
SIZES = st.sampled_from([0, 1, 2, 7, 64, 1000] * 2 + [60000, 99999, 10**9])


@st.composite
def risky_expressions(draw, depth: int = 0) -> str:
    """A jinja2 expression mixing the constructs that size a result or the work."""
    if depth > 2 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(['"ab"', '"\\t"', '"x\\n"', "m['content']", "bos_token", "eos_token", '"%s"']))
    inner, n = draw(risky_expressions(depth + 1)), draw(SIZES)
    return draw(
        st.sampled_from(
            [
                f"({inner}) * {n}",
                f"({inner}) ~ ({inner})",
                f'({inner}).replace("a", ({inner}) * {n})',
                f"({inner})|join({inner})",
                f"({inner}).expandtabs({n})",
                f"({inner}).translate({{97: ({inner}) * {n}}})",
                f"({inner})|indent({n})",
                f"({inner})|center({n})",
                f'"{{:>{{w}}}}".format({inner}, w="{n}")',
                f'"%-*s" % ({n}, {inner})',
                f"(({n} ** {draw(SIZES)}) ** {draw(SIZES)})|string",
                f"({inner}) * ({n} // {draw(SIZES)})",
            ]
        )
    )


@st.composite
def risky_templates(draw, depth: int = 0) -> str:
    """A template: the framing of each turn, around statements built from loops, namespaces and macros."""
    if depth > 1 or draw(st.booleans()):
        return f"{{{{ {draw(risky_expressions())} }}}}"
    body, n = draw(risky_templates(depth + 1)), draw(SIZES)
    return draw(
        st.sampled_from(
            [
                f"{{% for i in range({n}) %}}{body}{{% endfor %}}",
                f'{{% set ns = namespace(s="ab") %}}{{% for i in range({n}) %}}{{% set ns.s = ns.s ~ ns.s %}}'
                f"{{% endfor %}}{{{{ ns.s }}}}{body}",
                f"{{% macro f(k) %}}{body}{{% if k > 0 %}}{{{{ f(k - 1) }}}}{{{{ f(k - 1) }}}}{{% endif %}}"
                f"{{% endmacro %}}{{{{ f({draw(st.integers(0, 40))}) }}}}",
                f"{body}{body}",
            ]
        )
    )


@FUZZ
@given(template=risky_templates(), where=st.sampled_from(["before", "inside"]))
def test_fuzz_any_risky_template_renders_within_the_limit_or_is_refused(directory, one_cpu_second, template, where):
    source = (
        template + FRAMING
        if where == "before"
        else FRAMING.replace("{{ m['content'] }}", template + "{{ m['content'] }}")
    )
    start = time.perf_counter()
    try:
        tokenizer = _load(directory, template=source)
        encoding = tokenizer.encode_turns([Turn("user", "hi"), Turn("assistant", "yo")], open_turn="assistant")
    except ApiError as error:
        assert error.field == "chat_template", error
    else:  # at most 4 ids a character of framing, and the turns' own
        assert len(encoding.ids) <= 4 * OUTPUT_LIMIT + 8
    assert time.perf_counter() - start < 3 * WALL_SECONDS + 10


ATOMS = ["a", "x", r"\s", r"\p{L}", r"\p{N}", "[^\\s\\p{L}]", ".", "'s", " ?", r"\w", "[\r\n]"]


@st.composite
def regexes(draw, depth: int = 0) -> str:
    """An Oniguruma pattern from atoms, quantifiers, groups and alternations, nested (or any text)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=12))
    if depth > 2 or draw(st.booleans()):
        return draw(st.sampled_from(ATOMS)) + draw(st.sampled_from(["", "*", "+", "?", "{1,3}", "{2,}"]))
    parts = draw(st.lists(regexes(depth + 1), min_size=1, max_size=3))
    joined = draw(st.sampled_from(["", "|"])).join(parts)
    return f"(?:{joined})" + draw(st.sampled_from(["", "*", "+", "?", "{1,3}", "$"]))


@FUZZ
@given(pattern=regexes(), where=st.sampled_from(["pre_tokenizer", "normalizer"]))
def test_fuzz_a_tokenizer_regex_loads_and_encodes_or_is_refused(directory, gpt2_json, one_cpu_second, pattern, where):
    """A mutated pre_tokenizer or normalizer pattern: refused at load naming the tokenizer, or every
    text encodes to ids of the vocabulary (or is refused naming the text: a panic the probes missed)."""
    start = time.perf_counter()
    try:
        tokenizer = _load(directory, spec=_with_split(gpt2_json, pattern, where))
    except ApiError as error:
        assert error.field == "tokenizer", error
    else:
        for text in ("some text about the cat", "a" * 30 + "!", "  \n\n x1 '" * 8):
            try:
                ids = tokenizer.encode_text(text)
            except ApiError as error:
                assert error.field == "text" and "tokenizer.json's pipeline fails" in error.reason, error
            else:
                assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert time.perf_counter() - start < WALL_SECONDS + 10
