"""Incremental decoding (jgpt/tokenizers/incremental_decoder.py) against the whole-sequence decode it replaces.

For any ids, given in groups of any sizes: after each group the text given out so far is exactly
`decode(ids so far, final=False).text`, and after `finish` exactly `decode(ids).text`. Checked for jgpt's
byte tokenizer (bytes only, and with merges) and for a GPT-2-style and a Llama-style Hugging Face tokenizer
trained locally; the ids lean on the bytes of no whole character, byte-fallback pieces and control or
special ids, where the decodes differ from plain UTF-8.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jgpt.tokenizers.framing import TURN_END_ID
from jgpt.tokenizers.incremental_decoder import PieceDecoder, WindowDecoder
from jgpt.tokenizers.tokenizer import Tokenizer
from jgpt.tokenizers.tokenizer_file import load_tokenizer
from tests.hf_models import CORPUS, gpt2_tokenizer, llama_tokenizer

EOS = {"gpt2": "<|endoftext|>", "llama": "</s>"}


@pytest.fixture(scope="module", params=["bytes", "merges", "gpt2", "llama"])
def tokenizer(request, tmp_path_factory) -> Tokenizer:
    if request.param == "bytes":
        return Tokenizer.bytes_only()
    if request.param == "merges":
        return Tokenizer.train(CORPUS, 300)
    directory = tmp_path_factory.mktemp(request.param)
    (gpt2_tokenizer() if request.param == "gpt2" else llama_tokenizer()).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS[request.param]}))
    return load_tokenizer(directory / "tokenizer.json")


def ids_of(vocab_size: int) -> st.SearchStrategy[list[int]]:
    """Ids anywhere in the vocabulary, and more often the low ids (controls, specials, fallback pieces) and the
    bytes past ASCII (leads, continuations and bytes of no character)."""
    return st.lists(
        st.one_of(
            st.integers(0, vocab_size - 1), st.integers(0, 8), st.integers(0x80, 0xFF), st.integers(256, 263)
        ).map(lambda token_id: min(token_id, vocab_size - 1)),
        max_size=40,
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_text_given_out_is_the_whole_decode_after_every_group_of_ids(tokenizer, data):
    ids = data.draw(ids_of(tokenizer.vocab_size))
    decoder = tokenizer.incremental_decoder()
    given_out, at = "", 0
    while at < len(ids):
        size = data.draw(st.integers(1, 4))
        given_out += decoder.add(ids[at : at + size])
        at = min(len(ids), at + size)
        assert given_out == tokenizer.decode(ids[:at], final=False).text, ids[:at]
    assert given_out + decoder.finish() == tokenizer.decode(ids).text


def test_each_kind_of_tokenizer_decodes_with_its_own_decoder(tokenizer):
    kind = WindowDecoder if type(tokenizer) is not Tokenizer else PieceDecoder
    assert isinstance(tokenizer.incremental_decoder(), kind)


def test_a_split_character_waits_and_an_unfinished_one_is_marked_at_the_end():
    decoder = Tokenizer.bytes_only().incremental_decoder()
    assert [decoder.add([b]) for b in "é".encode() + b"a\xc3"] == ["", "é", "a", ""]
    assert decoder.add([TURN_END_ID, 0xFF]) == "<0xC3><|turn_end|><0xFF>"  # a control ends the open character
    assert decoder.add([0xE2, 0x82]) == "" and decoder.finish() == "<0xE2><0x82>"


def test_a_windowed_decode_keeps_the_space_a_window_start_would_strip(tokenizer):
    """Llama's decoder strips the text's leading space: a window starting at "▁world" must not."""
    ids = tokenizer.encode_text("the cat and the dog")
    decoder = tokenizer.incremental_decoder()
    assert "".join(decoder.add([token_id]) for token_id in ids) + decoder.finish() == "the cat and the dog"
