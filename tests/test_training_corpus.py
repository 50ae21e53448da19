"""The built-in conversation corpus, the text corpus and the batch sampler."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jgpt.foundation.errors import ApiError
from jgpt.tokenizers.framing import Turn
from jgpt.tokenizers.tokenizer import Tokenizer
from training import conversation_corpus
from training.batches import TokenRows, TokenStream
from training.config import TrainingConfig
from training.corpus import encode_conversation, exercises_of, prepare

WIDTH = 129


@pytest.fixture(scope="module")
def corpus():
    return conversation_corpus.generate(seed=3, train_size=3000, development_size=300, max_tokens=WIDTH)


def expected_answer(request: str, stored: dict[str, str]) -> str:
    """An independent reading of each request, from its text alone."""
    if m := re.fullmatch(r"reverse ([a-z]+)", request):
        return m[1][::-1]
    if m := re.fullmatch(r"sort ([a-z]+)", request):
        return "".join(sorted(m[1]))
    if m := re.fullmatch(r"add (\d+)\+(\d+)", request):
        return str(int(m[1]) + int(m[2]))
    if m := re.fullmatch(r"count ([a-z]) in ([a-z]+)", request):
        return str(m[2].count(m[1]))
    if m := re.fullmatch(r"store ([a-z]+) ([a-z]+)", request):
        stored[m[1]] = m[2]
        return "ok"
    if m := re.fullmatch(r"get ([a-z]+)", request):
        return stored[m[1]]
    raise AssertionError(f"unexpected request {request!r}")


def test_every_answer_is_right_and_every_skill_occurs(corpus):
    skills = set()
    for conversation in corpus.train + corpus.development:
        stored: dict[str, str] = {}
        for exchange in conversation.exchanges:
            assert exchange.answer == expected_answer(exchange.request, stored)
            skills.add(exchange.skill)
    assert skills == {None, "reverse", "sort", "add", "count", "recall"}


def test_splits_share_no_request_and_the_framings_vary(corpus):
    # A recall asks "get NAME" with a handful of names; what is held out is the value stored earlier.
    requests = lambda split: {e.request for c in split for e in c.exchanges if e.skill != "recall"}
    assert not requests(corpus.train) & requests(corpus.development)
    conversations = corpus.train + corpus.development
    # With and without the shared system turn, with and without a stored value, recalled early and last.
    assert {c.turns()[0][0] for c in conversations} == {"system", "user"}
    assert {c.system for c in conversations} == {conversation_corpus.SYSTEM_TEXT, None}
    with_store = [c for c in conversations if c.exchanges[0].request.startswith("store ")]
    assert 0.6 < len(with_store) / len(conversations) < 0.9
    recall_at = {[e.skill for e in c.exchanges].index("recall") for c in with_store}
    assert {1, 2} <= recall_at and max(recall_at) >= 4
    assert all(sum(e.skill is not None for e in c.exchanges) >= 1 for c in conversations)
    assert max(c.byte_length() for c in conversations) <= WIDTH


def test_data_sha256_is_a_function_of_the_seed(corpus):
    again = conversation_corpus.generate(seed=3, train_size=3000, development_size=300, max_tokens=WIDTH)
    other = conversation_corpus.generate(seed=4, train_size=3000, development_size=300, max_tokens=WIDTH)
    assert again.data_sha256 == corpus.data_sha256 != other.data_sha256
    assert again.document() == corpus.document()


def test_encoding_matches_the_tokenizer_and_weights_cover_exactly_assistant_turns(corpus):
    tokenizer = Tokenizer.bytes_only()
    for conversation in corpus.development[:50]:
        ids, weights = encode_conversation(tokenizer, conversation)
        encoding = tokenizer.encode_turns([Turn(role, text) for role, text in conversation.turns()])
        assert tuple(ids) == encoding.ids
        roles = [role for role, _ in conversation.turns()]
        for span in encoding.spans:
            start, stop = span.token_start, span.token_end
            is_marker = span.kind == "control" and ids[start] != tokenizer.turn_end_id
            expected = int(roles[span.turn] == "assistant" and not is_marker)
            assert weights[start:stop] == [expected] * (stop - start)


def test_exercise_prompts_end_at_the_assistant_marker_and_precede_their_answer(corpus):
    tokenizer = Tokenizer.bytes_only()
    for conversation in corpus.development[:50]:
        ids, _ = encode_conversation(tokenizer, conversation)
        exercises = exercises_of(tokenizer, conversation)
        assert [e.skill for e in exercises] == [x.skill for x in conversation.exchanges if x.skill]
        for exercise in exercises:
            n = len(exercise.prompt)
            assert tuple(ids[:n]) == exercise.prompt and ids[n - 1] == tokenizer.role_id("assistant")
            answer = [*tokenizer.encode_text(exercise.answer), tokenizer.turn_end_id]
            assert ids[n : n + len(answer)] == answer


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), step=st.integers(0, 10**6))
def test_a_batch_is_a_function_of_the_step_and_stream_windows_are_contiguous(seed, step):
    tokens = np.arange(1000, dtype=np.int32) % 251
    stream = TokenStream(tokens, context=16)
    key = jax.random.fold_in(jax.random.key(seed), step)
    batch = stream.sample(key, 4)
    again = stream.sample(jax.random.fold_in(jax.random.key(seed), step), 4)
    assert np.array_equal(batch.inputs, again.inputs)
    inputs, targets = np.asarray(batch.inputs), np.asarray(batch.targets)
    assert np.array_equal(inputs[:, 1:], targets[:, :-1])
    for row in range(4):
        start = int(np.flatnonzero(tokens == inputs[row, 0])[0])
        assert np.array_equal(np.r_[inputs[row], targets[row, -1]], tokens[start : start + 17])


def test_rows_chunks_visit_every_row_once_with_padding_weighted_zero():
    rows = TokenRows(np.arange(70, dtype=np.int32).reshape(7, 10), np.ones((7, 10), np.uint8))
    chunks = rows.chunks(3)
    assert [c.inputs.shape for c in chunks] == [(3, 9)] * 3
    assert float(sum(c.mask.sum() for c in chunks)) == 7 * 9
    assert np.array_equal(np.concatenate([c.inputs for c in chunks])[:7], np.arange(70).reshape(7, 10)[:, :9])


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "file not found"),
        (b"", "is empty"),
        (b" \n", "is empty"),
        (b"\xff\xfeabc" * 50, "not UTF-8"),
        (b"short", "tokens"),
    ],
)
def test_text_corpus_rejects_bad_files(tmp_path, content, reason):
    path = tmp_path / "data.txt"
    if content is not None:
        path.write_bytes(content)
    config = TrainingConfig(data=str(path), out=str(tmp_path / "run"), context=32)
    with pytest.raises(ApiError, match=reason) as error:
        prepare(config)
    assert error.value.field == "data"


def test_text_corpus_splits_by_position_and_hashes_the_file(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    prepared = prepare(
        TrainingConfig(data=str(path), out=str(tmp_path / "run"), context=32, tokenizer="bpe", vocab_size=280)
    )
    assert prepared.tokenizer.vocab_size == 280
    train_text = prepared.tokenizer.decode(np.asarray(prepared.train.tokens).tolist()).text
    assert path.read_text().startswith(train_text)
    import hashlib

    assert prepared.data_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
