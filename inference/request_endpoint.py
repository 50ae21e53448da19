"""RequestEndpoint: the OpenAI API's request and response contracts, over InferenceRequest and the engine's outcomes.

A completion (`POST /v1/completions`: a prompt as raw text, encoded with no framing, or as token ids) or a
chat completion (`POST /v1/chat/completions`: messages framed with the model's own turn framing or chat
template, the assistant's turn left open) becomes one InferenceRequest, checked by the rules the CLI applies
(GenerationPolicy, check_prompt, a budget past the context stopping there) and refused with the field and the
value named. What the engine publishes for it (each selected id, then its outcome) becomes the response:
whole, or as server-sent-event chunks. The HTTP server (inference/http_endpoint.py) carries these documents;
nothing here does I/O.

Every endpoint request draws its samples from the random stream `jgpt generate` draws from, so a seed selects
the same ids through the endpoint and the CLI, whatever id the server gave the request; a request that
samples without a seed is given a fresh one by the caller, as the OpenAI API draws afresh each time.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from inference.generation import selectable
from inference.policy import GREEDY, SAMPLE, STOP_TURN_END, GenerationPolicy, InferenceRequest, check_prompt
from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import array, boolean, integer, mapping, string
from jgpt.foundation.validation import kind as json_kind
from jgpt.tokenizers.framing import Turn
from jgpt.tokenizers.prompt_format import CHAT as CHAT_FORMAT
from jgpt.tokenizers.prompt_format import PLAIN, framed
from jgpt.tokenizers.tokenizer import Tokenizer

COMPLETION, CHAT = "text_completion", "chat.completion"
CLI_STREAM = "cli"  # the request id whose random stream `jgpt generate` draws from
# The OpenAI API's default max_tokens for a completion; a chat's is all the context leaves (at most the system's cap).
COMPLETION_DEFAULT_TOKENS = 16
MAX_STOP_STRINGS = 4
_SAMPLING = ("temperature", "top_p", "top_k", "seed")
_COMMON = {"model", "max_tokens", *_SAMPLING, "stop", "n", "stream", "stream_options", "user"}
# Fields the API defines that jgpt does not implement: accepted only with the value that leaves them unused.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,), "best_of": (1,), "echo": (False,), "logprobs": (False, None), "top_logprobs": (0, None),
    "frequency_penalty": (0,), "presence_penalty": (0,), "logit_bias": ({}, None), "suffix": (None, ""),
}  # fmt: skip
_FIELDS = {
    COMPLETION: _COMMON | {"prompt", "best_of", "echo", "logprobs", "frequency_penalty", "presence_penalty",
                           "logit_bias", "suffix"},
    CHAT: _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "frequency_penalty",
                     "presence_penalty", "logit_bias"},
}  # fmt: skip
# Chat roles onto the model's turn roles: the API's newer "developer" role is its system role.
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """What the endpoint knows of the model it serves: its name, tokenizer and shape."""

    name: str
    tokenizer: Tokenizer
    vocabulary: int
    context: int
    turn_end_id: int
    max_new_tokens_cap: int  # the system's: a request that gives no budget asks for at most this many ids
    created: int  # unix seconds: when the server started (the API's `created`)
    prompt_format: str = CHAT_FORMAT  # how a chat's messages are framed (jgpt/tokenizers/prompt_format.py)

    def listing(self) -> dict[str, Any]:
        """GET /v1/models."""
        return {
            "object": "list",
            "data": [{"id": self.name, "object": "model", "created": self.created, "owned_by": "jgpt",
                      "max_model_len": self.context}],
        }  # fmt: skip


@dataclasses.dataclass(frozen=True)
class EndpointRequest:
    """One API call, read: the InferenceRequest the engine serves and what the response must honour."""

    kind: str  # COMPLETION or CHAT
    request: InferenceRequest
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk carries the usage
    stop: tuple[str, ...]  # stop strings: the text ends before the first of them


def read_request(kind: str, body: Any, model: ServedModel, request_id: str, fresh_seed: int) -> EndpointRequest:
    """The EndpointRequest of a parsed JSON body (`kind` COMPLETION or CHAT), or an ApiError naming the field.

    fresh_seed: the seed of a request that samples without giving one.
    """
    if not isinstance(body, dict):
        raise ApiError("body", f"expected a JSON object, got {json_kind(body)}")
    given = {name: value for name, value in body.items() if value is not None}  # the API's null is "not given"
    for name, value in given.items():
        if name not in _FIELDS[kind]:
            raise ApiError(name, "unknown field")
        if name in _NEUTRAL and value not in _NEUTRAL[name]:
            raise ApiError(name, f"{value!r} is not supported; jgpt serves {name}={_NEUTRAL[name][0]!r} only")
    if "model" in given and given["model"] != model.name:
        raise ApiError("model", f"{given['model']!r} is not served here; this server serves {model.name!r}")
    prompt_field = "prompt" if kind == COMPLETION else "messages"
    if prompt_field not in given:
        raise ApiError(prompt_field, "missing required field")
    prompt_ids = _prompt(given["prompt"], model) if kind == COMPLETION else _chat_prompt(given["messages"], model)
    check_prompt(prompt_ids, model.vocabulary, model.context, prompt_field)
    budget_field = "max_completion_tokens" if "max_completion_tokens" in given else "max_tokens"
    default = min(COMPLETION_DEFAULT_TOKENS if kind == COMPLETION else model.context, model.max_new_tokens_cap)
    policy = _policy(given, given.get(budget_field, default), budget_field, fresh_seed)
    # A budget past the context keeps its meaning, as in `jgpt generate`: the request stops at the context.
    budget = selectable(prompt_ids, policy.max_new_tokens, model.context)
    generation = dataclasses.replace(policy, max_new_tokens=budget)
    request = InferenceRequest(request_id, tuple(prompt_ids), generation, draws_from=CLI_STREAM)
    stream = boolean(given.get("stream", False), "stream")
    options = given.get("stream_options", {})
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise ApiError("stream_options", 'expected {"include_usage": true|false}')
    return EndpointRequest(
        kind, request, stream, boolean(options.get("include_usage", False), "stream_options.include_usage"),
        _stop(given.get("stop", [])),
    )  # fmt: skip


def _policy(given: Mapping[str, Any], budget: Any, budget_field: str, fresh_seed: int) -> GenerationPolicy:
    """The CLI's GenerationPolicy of the API's fields: temperature 0 selects greedily (the rule's limit), any
    other samples, with a fresh seed unless one is given. The API's default temperature is 1."""
    sampling = {name: given[name] for name in _SAMPLING if name in given}
    sampling.setdefault("temperature", 1.0)
    sampling.setdefault("seed", fresh_seed)
    try:
        policy = GenerationPolicy(budget, SAMPLE, **sampling)  # every field checked, greedy or not
    except ApiError as error:
        # A refusal names the field as the client sent it: the budget is GenerationPolicy's max_new_tokens.
        raise ApiError(budget_field if error.field == "max_new_tokens" else error.field, error.reason) from None
    return GenerationPolicy(budget, GREEDY) if policy.temperature == 0 else policy


def _prompt(value: Any, model: ServedModel) -> list[int]:
    """A completion's prompt: text (encoded with no framing) or token ids, alone or as the one item of a list."""
    if isinstance(value, list) and value and all(isinstance(item, (str, list)) for item in value):
        if len(value) != 1:
            raise ApiError("prompt", f"holds {len(value)} prompts; jgpt serves one prompt per request")
        return _prompt(value[0], model)
    if isinstance(value, str):
        try:
            return model.tokenizer.encode_text(value)
        except ApiError as error:
            raise ApiError("prompt", error.reason) from None
    ids = array(value, "prompt")
    for index, token in enumerate(ids):
        integer(token, f"prompt[{index}]", 0, model.vocabulary - 1)
    return ids


def _chat_prompt(value: Any, model: ServedModel) -> list[int]:
    """Messages framed as the model's turns, the assistant's turn left open for the reply; a plain-text model
    frames no turns, so its chat is refused (its text goes to /v1/completions)."""
    if model.prompt_format == PLAIN:
        raise ApiError(
            "messages",
            f"{model.name!r} is a plain-text model (prompt_format {PLAIN!r}): it has no chat framing; "
            "send its text to /v1/completions",
        )
    turns = []
    for index, message in enumerate(array(value, "messages")):
        at = f"messages[{index}]"
        message = mapping(message, at, {"role", "content"}, {"name"})
        role = string(message["role"], f"{at}.role")
        if role not in _ROLES:
            raise ApiError(f"{at}.role", f"{role!r} is not a role jgpt frames; choose from {', '.join(_ROLES)}")
        turns.append(Turn(_ROLES[role], _content(message["content"], f"{at}.content")))
    if not turns:
        raise ApiError("messages", "is empty; a chat needs at least one message")
    try:
        return framed(model.tokenizer, model.prompt_format, turns)
    except ApiError as error:  # the tokenizer names turns[i].text: message i's content
        field = re.sub(r"^turns\[(\d+)\]\.text", r"messages[\1].content", error.field).replace("turns", "messages", 1)
        raise ApiError(field, error.reason) from None


def _content(value: Any, field: str) -> str:
    """A message's text: a string, or a list of text parts joined."""
    if isinstance(value, str):
        return value
    parts = []
    for index, part in enumerate(array(value, field)):
        part = mapping(part, f"{field}[{index}]", {"type"}, {"text"})
        if part["type"] != "text" or "text" not in part:
            raise ApiError(f"{field}[{index}]", 'jgpt reads text parts only: {"type": "text", "text": "..."}')
        parts.append(string(part["text"], f"{field}[{index}].text"))
    return "".join(parts)


def _stop(value: Any) -> tuple[str, ...]:
    strings = [value] if isinstance(value, str) else array(value, "stop")
    if len(strings) > MAX_STOP_STRINGS:
        raise ApiError("stop", f"holds {len(strings)} strings; at most {MAX_STOP_STRINGS}")
    for index, text in enumerate(strings):
        if not string(text, f"stop[{index}]"):
            raise ApiError(f"stop[{index}]", "is empty; a stop string needs at least one character")
    return tuple(strings)


# -- what is sent back ------------------------------------------------------------------------------------------


def finish_reason(outcome: Mapping[str, Any], stopped_by_string: bool) -> str:
    """The API's finish_reason: "stop" at the end of the model's turn or a stop string, "length" at the budget
    or the context, "abort" when the server cancelled the request (draining past its bound)."""
    if stopped_by_string or outcome["stop_reason"] == STOP_TURN_END:
        return "stop"
    return "abort" if outcome["status"] == "cancelled" else "length"


def usage(outcome: Mapping[str, Any]) -> dict[str, Any]:
    """Token counts: the prompt's, the ids selected (the end of the turn included) and the prompt's reused prefix."""
    prompt, selected = outcome["prompt_positions"], outcome["selected_tokens"]
    return {
        "prompt_tokens": prompt,
        "completion_tokens": selected,
        "total_tokens": prompt + selected,
        "prompt_tokens_details": {"cached_tokens": outcome["reuse_positions"]},
    }


def response(
    call: EndpointRequest, model: ServedModel, response_id: str, text: str, ids: list[int], finish: str,
    outcome: Mapping[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The whole (non-streamed) response. `token_ids` (an extension) are the published ids behind the text."""
    if call.kind == COMPLETION:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}  # fmt: skip
    return {
        "id": response_id, "object": call.kind, "created": model.created, "model": model.name,
        "choices": [choice | {"token_ids": ids}], "usage": usage(outcome),
    }  # fmt: skip


def chunk(
    call: EndpointRequest, model: ServedModel, response_id: str, text: str | None, ids: list[int],
    finish: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One streamed chunk: a piece of text with the ids behind it, or (text None) a chat's opening role chunk."""
    if call.kind == COMPLETION:
        choice: dict[str, Any] = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    else:
        delta = {"role": "assistant", "content": ""} if text is None else {} if finish else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {
        "id": response_id, "object": f"{call.kind}.chunk" if call.kind == CHAT else call.kind,
        "created": model.created, "model": model.name, "choices": [choice | {"token_ids": ids}],
    }  # fmt: skip


def usage_chunk(call: EndpointRequest, model: ServedModel, response_id: str, outcome: Mapping[str, Any]) -> dict:
    """The last chunk of a stream that asked for usage: no choices."""
    return {
        "id": response_id, "object": f"{call.kind}.chunk" if call.kind == CHAT else call.kind,
        "created": model.created, "model": model.name, "choices": [], "usage": usage(outcome),
    }  # fmt: skip


def event(document: Mapping[str, Any]) -> bytes:
    """One server-sent event carrying a JSON document."""
    return b"data: " + orjson.dumps(document) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def error(message: str, param: str | None, error_type: str = "invalid_request_error") -> dict[str, Any]:
    """The API's error document."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": None}}


def refusal(problem: ApiError) -> dict[str, Any]:
    """A bad request's error document: the field at fault as `param`, "field: reason" as the message."""
    return error(str(problem), problem.field)


class PublishedText:
    """A request's text as its ids are published: each id's new text, an unfinished UTF-8 character and any tail
    that may begin a stop string held back until decided. The ids behind a piece of text come with it. Each id is
    decoded once (the tokenizer's incremental decoder); a stop string is looked for in the text not given out yet
    and the tail of the text given out that could begin one."""

    def __init__(self, tokenizer: Tokenizer, turn_end_id: int, stop: tuple[str, ...]):
        self.decoder, self.turn_end_id, self.stop = tokenizer.incremental_decoder(), turn_end_id, stop
        self.longest = max(map(len, stop), default=0)
        self.unsent: list[int] = []
        self.held = ""  # text decoded, not given out yet
        self.tail = ""  # the last characters given out, fewer than the longest stop string's
        self.stopped = False  # a stop string matched: the text is whole

    def add(self, token_id: int) -> tuple[str, list[int]]:
        """The text and ids this selected id releases (both may be empty)."""
        return self.extend([token_id])

    def extend(self, token_ids: Sequence[int]) -> tuple[str, list[int]]:
        """The text and ids these selected ids release, decoded once (both may be empty). With stop strings give
        ids one at a time: ids past a stop string that came in the same group are given out with it."""
        kept = [] if self.stopped else [t for t in token_ids if t != self.turn_end_id]
        if not kept:
            return "", []
        self.unsent += kept
        self.held += self.decoder.add(kept)
        return self.release(final=False)

    def release(self, final: bool) -> tuple[str, list[int]]:
        """What can be given out now; with final, everything left (the request has ended)."""
        if self.stopped:
            return "", []
        if final:
            self.held += self.decoder.finish()
        text, start = self.tail + self.held, len(self.tail)
        end = len(text)
        if self.stop:
            found = [at for s in self.stop if (at := text.find(s)) >= 0]
            if found:
                end, self.stopped = min(found), True
            elif not final:
                end -= self.held_back(text)
        end = max(end, start)
        piece, self.held = text[start:end], text[end:]
        self.tail = text[max(0, end - self.longest + 1) : end] if self.longest > 1 else ""
        if not piece and not final and not self.stopped:
            return "", []
        ids, self.unsent = self.unsent, []
        return piece, ids

    def held_back(self, text: str) -> int:
        """The length of the longest tail of `text`, past the text given out, that begins some stop string."""
        for length in range(min(self.longest - 1, len(self.held)), 0, -1):
            tail = text[-length:]
            if any(s.startswith(tail) for s in self.stop):
                return length
        return 0
