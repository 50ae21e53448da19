"""The inference commands: `jgpt generate`, `jgpt record` and `jgpt serve` (also `python -m inference ...`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NamedTuple

from jgpt.foundation import progress
from jgpt.foundation.command_line import ArgumentParser
from jgpt.foundation.errors import ApiError, one_line
from jgpt.foundation.json_input import read_json
from jgpt.foundation.output_paths import output_file
from jgpt.model.architecture import PRECISION_NAMES

SUMMARIES = {
    "generate": "continue a prompt, framed as the model declares (a chat turn or plain text), greedily or sampled, "
    "in a jitted KV-cached loop (speculative with --draft), streaming text or JSON evidence",
    "record": "run a Workload and write the recorded computation document kvsim consumes",
    "serve": "serve a Workload on the InferenceEngine against the wall clock and write the measured-run document, "
    "or (--http) serve live clients the OpenAI API",
}


def main(command: str, argv: list[str]) -> int:
    if command not in COMMANDS:
        raise ApiError("command", f"unknown inference command {command!r}; choose from {', '.join(SUMMARIES)}")
    return COMMANDS[command](argv)


def _parser(command: str) -> argparse.ArgumentParser:
    """The command's parser: the model options every inference command shares, then its own arguments."""
    parser = ArgumentParser(prog=f"jgpt {command}", description=SUMMARIES[command])
    _model_arguments(parser)
    ARGUMENTS[command](parser)
    return parser


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model a command runs, the precision it runs at and the kernel plan it runs under (`_load`)."""
    parser.add_argument(
        "--model", metavar="MODEL", help="catalog id or artifact directory (default: the catalog's default model)"
    )
    parser.add_argument(
        "--precision",
        choices=PRECISION_NAMES,
        help="compute, weight matrices and KV state in this precision (default: the model's)",
    )
    parser.add_argument(
        "--kernels",
        choices=("auto", "xla"),
        default="auto",
        help="auto: jgpt's decode kernels where this CPU runs them (AVX-512F); xla: the pure-JAX reference "
        "(the plan that ran is recorded as execution.kernels)",
    )


def _generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "prompt", nargs="*", metavar="PROMPT",
        help="the prompt text (words are joined by spaces): a user turn for a chat model, the text to continue "
        "for a plain-text model",
    )  # fmt: skip
    parser.add_argument(
        "--ids", metavar="ID,ID,...", help="raw prompt token ids instead of text, e.g. 257,72,105,259,258"
    )
    parser.add_argument(
        "--turns", metavar="FILE.json",
        help='a conversation instead of PROMPT: a JSON list of {"role", "text"} turns (as `jgpt tokenize --turns` '
        "reads), the assistant's reply to follow",
    )  # fmt: skip
    parser.add_argument("--system", metavar="TEXT", help="a system turn before the conversation (chat models)")
    _framing_arguments(parser)
    parser.add_argument(
        "--max-new-tokens", type=int, default=64, metavar="N", help="budget of selected ids, TURN_END included"
    )
    parser.add_argument("--json", action="store_true", help="print the response with all evidence as one JSON object")
    parser.add_argument("--observe", type=int, metavar="STEP", help="record every model operation's tensors at STEP")
    _sampling_arguments(parser)
    parser.add_argument(
        "--draft",
        metavar="MODEL",
        help="decode speculatively: this catalog id or artifact proposes ids "
        "('prompt-lookup': the row's own earlier ids and the last verify's guesses, no model)",
    )
    parser.add_argument("--speculate", type=int, metavar="K", help="with --draft: ids drafted per round (default 4)")


def _framing_arguments(parser: argparse.ArgumentParser) -> None:
    """--raw and --chat: how a prompt's text is framed, overriding the model's declared prompt_format."""
    framing = parser.add_mutually_exclusive_group()
    framing.add_argument(
        "--raw",
        action="store_true",
        help="frame nothing: a prompt is its text's ids as they stand (a plain model's default)",
    )
    framing.add_argument(
        "--chat", action="store_true",
        help="frame a prompt as turns (text as a user turn) by the model's chat framing or template (a chat model's default)",
    )  # fmt: skip


def _sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """--sample and the settings of its draws (GenerationPolicy's). A setting given implies --sample."""
    parser.add_argument(
        "--sample", action="store_true",
        help="draw each id (seeded sampling) instead of greedy selection; --temperature, --top-k, --top-p or --seed "
        "given implies it",
    )  # fmt: skip
    parser.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="logits divided by T (0: greedy, as in the HTTP API; default 1 when sampling)",
    )
    parser.add_argument("--top-k", type=int, metavar="K", help="draw among the K most probable ids (default: all)")
    parser.add_argument(
        "--top-p", type=float, metavar="P", help="draw among the most probable ids reaching P (default: 1, all)"
    )
    parser.add_argument("--seed", type=int, metavar="S", help="the seed the draws' keys derive from (default 0)")


def _record_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", metavar="WORKLOAD.json", help="a Workload document")
    _framing_arguments(parser)
    parser.add_argument("--out", required=True, metavar="COMPUTATIONS.json", help="where to write the document")
    parser.add_argument("--no-reference", action="store_true", help="skip the full-prefix recompute of every work")
    parser.add_argument("--json", action="store_true", help="print what was recorded as JSON on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress on the terminal")


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "workload", nargs="?", metavar="WORKLOAD.json", help="a Workload document (optional customer_interaction)"
    )
    parser.add_argument(
        "--system", required=True, metavar="SYSTEM.json", help="the KVResidencySystemConfig kvsim reads"
    )
    parser.add_argument("--out", metavar="MEASURED.json", help="where to write the measured-run document")
    _framing_arguments(parser)
    parser.add_argument(
        "--as-fast-as-possible",
        action="store_true",
        help="every request arrives at the run's start and no action waits for its time",
    )
    parser.add_argument("--json", action="store_true", help="print the whole document instead of the summary")
    parser.add_argument("--quiet", action="store_true", help="print nothing, not even progress")
    _live_arguments(parser.add_argument_group("live clients (--http, instead of WORKLOAD.json and --out)"))


def _live_arguments(group) -> None:
    group.add_argument("--http", action="store_true", help="serve the OpenAI API (completions, chat) over HTTP")
    group.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    group.add_argument("--port", type=int, default=8000, help="the port to listen on (0: any free one)")
    group.add_argument(
        "--record",
        metavar="MEASURED.json",
        help="when the server stops, write the measured-run document of what it served",
    )
    group.add_argument(
        "--drain-seconds", type=int, default=30, metavar="S",
        help="on SIGTERM, how long requests in flight may take to finish before they are cancelled",
    )  # fmt: skip


def _generate(argv: list[str]) -> int:
    args = _parser("generate").parse_args(argv)
    _check_generate_arguments(args)

    from inference.policy import InferenceRequest, implied_policy

    sampling = {
        name: getattr(args, name)
        for name in ("temperature", "top_k", "top_p", "seed")
        if getattr(args, name) is not None
    }
    policy = implied_policy(args.max_new_tokens, sampling, args.sample)
    given_ids = _parse_ids(args.ids) if args.ids else None
    given_turns = _turns_file(args.turns) if args.turns else None
    if args.observe is not None and not 0 <= args.observe < args.max_new_tokens:
        raise ApiError(
            "observe", f"step {args.observe} is outside 0..{args.max_new_tokens - 1}, the steps the budget allows"
        )
    execution, tokenizer, declared = _load(args.model, args.precision, args.kernels)
    text: str | None = None
    if given_ids is None:  # the arguments give exactly one of PROMPT, --ids and --turns (checked above)
        prompt_ids = tuple(_prompt_ids(args, tokenizer, declared, " ".join(args.prompt), given_turns))
        # the user text the prompt encodes: PROMPT's, or the conversation's last user turn (as a Workload's)
        users = [turn.text for turn in given_turns or () if turn.role == "user"]
        text = " ".join(args.prompt) if given_turns is None else (users[-1] if users else None)
    else:
        prompt_ids = given_ids
    request = InferenceRequest("cli", prompt_ids, policy, text=text)
    stream = None if args.json else _TextStream(tokenizer, execution.turn_end_id)
    response = _generated(args, execution, request, stream)
    if stream is not None:
        stream.finish(response)
        return 0
    print(json.dumps(_response_json(response, tokenizer, execution), indent=1))
    return 0


def _check_generate_arguments(args: argparse.Namespace) -> None:
    """The combinations of arguments `jgpt generate` refuses before it loads anything."""
    if [bool(args.prompt), bool(args.ids), args.turns is not None].count(True) != 1:
        raise ApiError("prompt", "give exactly one of PROMPT text, --turns FILE.json or --ids")
    if args.ids:
        framing = [flag for flag, given in (("--system", args.system is not None), ("--raw", args.raw),
                                            ("--chat", args.chat)) if given]  # fmt: skip
        if framing:
            raise ApiError(framing[0].lstrip("-"), "frames text; --ids are the prompt's ids as they stand")
    if args.speculate is not None and args.draft is None:
        raise ApiError("speculate", "needs --draft MODEL, the model that proposes ids")
    if args.draft is not None and args.observe is not None:
        raise ApiError("observe", "is not available with --draft: the speculative loop runs as one compiled program")


def _turns_file(path: str):
    from jgpt.tokenizers.framing import turns_from_json

    turns = turns_from_json(read_json(path, "turns"))
    if not turns:
        raise ApiError("turns", f"{path} holds no turn; a conversation has at least one")
    return turns


def _prompt_ids(args: argparse.Namespace, tokenizer, declared: str, text: str, turns) -> list[int]:
    """The prompt's ids: the --system turn, then the conversation of --turns or PROMPT's user turn, framed by the
    format --raw or --chat names, else by the model's declared prompt_format."""
    from jgpt.tokenizers.framing import Turn
    from jgpt.tokenizers.prompt_format import framed

    conversation = (*(() if args.system is None else (Turn("system", args.system),)),
                    *((Turn("user", text),) if turns is None else turns))  # fmt: skip
    field = "system" if args.system is not None else "turns"
    return framed(tokenizer, _prompt_format(args, tokenizer, declared), conversation, field)


def _prompt_format(args: argparse.Namespace, tokenizer, declared: str) -> str:
    """The format a command frames by: --raw's plain, --chat's conversation framing, else the model's declared one."""
    from jgpt.tokenizers.prompt_format import PLAIN, conversation_format

    if args.raw:
        return PLAIN
    if not args.chat:
        return declared
    chat = conversation_format(tokenizer)
    if chat is None:
        raise ApiError("chat", "this model's tokenizer has no chat template: it frames no conversation")
    return chat


def _generated(args: argparse.Namespace, execution, request, stream: _TextStream | None):
    """The request's response: decoded speculatively with --draft, else in one call, or one step a call when
    the text streams or a step is observed."""
    from inference.generation import generate, generate_stepwise

    if args.draft is not None:
        from inference.speculative import PROMPT_LOOKUP, PromptLookup, generate_speculative

        draft = (
            PromptLookup() if args.draft == PROMPT_LOOKUP else _load(args.draft, args.precision, args.kernels).execution
        )
        k = 4 if args.speculate is None else args.speculate
        (response,) = generate_speculative(execution, draft, [request], k).responses
        if stream is not None:  # the loop is one program: the text comes at its end
            for token in response.output_ids:
                stream.select(0, token)
        return response
    if stream is None and args.observe is None:
        (response,) = generate(execution, [request], reference=True).responses
        return response
    # streaming and observing take the steps one call at a time
    generation = generate_stepwise(
        execution, [request], reference=args.json, observe_step=args.observe,
        on_select=None if stream is None else stream.select,
    )  # fmt: skip
    (response,) = generation.responses
    return response


def _record(argv: list[str]) -> int:
    args = _parser("record").parse_args(argv)
    output_file(args.out, "--out", [args.workload])
    document = read_json(args.workload, "workload")

    from inference.recorded_computations import read_workload, record, write_document
    from jgpt.tokenizers.tokenizer import Tokenizer

    read_workload(document, Tokenizer.bytes_only())  # its shape does not depend on the ids: refuse before loading
    with progress.shown(args.quiet):
        with progress.stage("loading model"):
            execution, tokenizer, declared = _load(args.model, args.precision, args.kernels)
        requests = read_workload(document, tokenizer, prompt_format=_prompt_format(args, tokenizer, declared))
        computations = record(
            execution, requests, tokenizer=tokenizer, reference=not args.no_reference, kind=document["kind"]
        )
    write_document(computations, args.out)
    works = sum(len(r["computations"]) for r in computations["requests"])
    if args.json:
        print(json.dumps({"requests": len(requests), "works": works, "out": args.out}))
    else:
        print(f"recorded {len(requests)} requests, {works} works -> {args.out}", file=sys.stderr)
    return 0


def _serve(argv: list[str]) -> int:
    args = _parser("serve").parse_args(argv)
    if args.http:
        return _serve_http(args)
    for name, value in (("workload", args.workload), ("out", args.out)):
        if value is None:
            raise ApiError(name, "is required (or --http, to serve live clients)")
    output_file(args.out, "--out", [args.workload, args.system])
    document, system_document = _json_file(args.workload, "workload"), _json_file(args.system, "system")

    from inference.engine import InferenceEngine, read_served_workload
    from inference.measured_run import measured_run, summary
    from inference.recorded_computations import write_document
    from kvsim import parse_system

    system = parse_system(system_document)
    with progress.shown(args.quiet or args.json):
        with progress.stage("loading model"):
            execution, tokenizer, declared = _load(args.model, args.precision, args.kernels)
        prompt_format = _prompt_format(args, tokenizer, declared)
        requests, interaction = read_served_workload(document, tokenizer, execution, prompt_format=prompt_format)
        # Ctrl-C or SIGTERM (run_guarded) unwinds the run: the document is written only once it is whole.
        engine = InferenceEngine(execution, system)
        # A stage draws only before and after: nothing writes to the terminal while the clock runs.
        with progress.stage(f"compiling and serving {len(requests)} requests"):
            served = engine.serve(requests, interaction, as_fast_as_possible=args.as_fast_as_possible)
    measured = measured_run(
        execution, system, served, kind=document["kind"], interaction=interaction, tokenizer=tokenizer
    )
    write_document(measured, args.out)
    if args.json:
        print(json.dumps(measured, indent=1))
    elif not args.quiet:
        print(f"{summary(measured)}\n-> {args.out}")
    return 0


def _serve_http(args: argparse.Namespace) -> int:
    """`jgpt serve --http`: the InferenceEngine on live requests, behind the OpenAI API, until SIGTERM or Ctrl-C."""
    _check_live_arguments(args)
    try:
        from inference.http_endpoint import HttpServer, RequestEndpoint, bind, print_announcement
    except ImportError as missing:
        raise ApiError(
            "http", f"needs the serving extra ({missing.name} is missing): pip install 'jgpt[serve]'"
        ) from None
    import time

    from inference.engine import InferenceEngine
    from inference.measured_run import measured_run, summary
    from inference.recorded_computations import write_document
    from inference.request_endpoint import ServedModel
    from jgpt.artifacts.catalog import read_catalog
    from kvsim import parse_system

    system = parse_system(_json_file(args.system, "system"))
    sock = bind(args.host, args.port)
    with progress.shown(args.quiet):
        with progress.stage("loading model"):
            execution, tokenizer, declared = _load(args.model, args.precision, args.kernels)
        prompt_format = _prompt_format(args, tokenizer, declared)
        with progress.stage("compiling for every request the system admits"):
            engine = InferenceEngine(execution, system).live()
    a, name = execution.architecture, read_catalog().default_id() if args.model is None else args.model
    model = ServedModel(
        name, tokenizer, a.vocabulary, a.context, execution.turn_end_id, system.max_new_tokens_cap, int(time.time()),
        prompt_format,
    )  # fmt: skip
    endpoint = RequestEndpoint(model, engine.serve, system.kv_cache.device_kv_bytes, system.kv_cache.host_kv_bytes)
    announce = (lambda address: None) if args.quiet else print_announcement
    served = HttpServer(endpoint, sock, drain_seconds=args.drain_seconds, announce=announce).run()
    if args.record is not None:
        interaction = endpoint.bridge.traffic.interaction()
        measured = measured_run(execution, system, served, kind="live", interaction=interaction, tokenizer=tokenizer)
        write_document(measured, args.record)
        if not args.quiet:
            print(f"{summary(measured)}\n-> {args.record}", file=sys.stderr)
    return 0


def _check_live_arguments(args: argparse.Namespace) -> None:
    given = [name for name in ("workload", "out", "json", "as_fast_as_possible") if getattr(args, name)]
    if given:
        raise ApiError(given[0], "is not taken with --http (live clients bring the requests; --record writes the run)")
    if not 0 <= args.port <= 65535:
        raise ApiError("port", f"must be in 0..65535, got {args.port}")
    if args.drain_seconds < 0:
        raise ApiError("drain-seconds", f"must be >= 0, got {args.drain_seconds}")
    if args.record is not None:
        output_file(args.record, "--record", [args.system])


def _json_file(path: str, field: str):
    return read_json(path, field)


class LoadedModel(NamedTuple):
    """A model ready to run: its execution, its tokenizer and the prompt format its artifact declares."""

    execution: Any  # inference.execution.ModelExecution (imported with jax, when a command loads a model)
    tokenizer: Any
    prompt_format: str


def _load(model: str | None, precision: str | None = None, kernels: str = "auto") -> LoadedModel:
    """The ModelExecution, Tokenizer and prompt format of a catalog id or artifact path (default: the catalog
    default), at the model's precision or at `precision` (a `--precision` name), its matrices stored in it, under
    the kernel plan `kernels` names (`--kernels`)."""
    from inference.execution import ModelExecution
    from inference.precision import at_precision
    from jgpt.artifacts.catalog import load_model, read_catalog
    from jgpt.kernels.plan import Kernels

    artifact = load_model(read_catalog().default_id() if model is None else model)
    tokenizer = artifact.tokenizer()
    execution = ModelExecution.from_artifact(artifact, tokenizer, kernels=Kernels.named(kernels))
    own = execution.architecture.precision
    execution = at_precision(execution, own if precision is None else PRECISION_NAMES[precision])
    return LoadedModel(execution, tokenizer, artifact.prompt_format)


def _parse_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ApiError("ids", f"must be comma-separated integers, got {text[:80]!r}") from None
    if min(ids) < 0:
        raise ApiError("ids", f"token ids are >= 0, got {min(ids)}")
    return ids


def terminal_text(text: str) -> str:
    """`text` with every control and format character but newline and tab escaped, as `jgpt catalog` escapes
    its cells (jgpt.foundation.errors.one_line): model text must not write escape sequences to a terminal."""
    return "\n".join("\t".join(map(one_line, line.split("\t"))) for line in text.split("\n"))


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False


class _TextStream:
    """Prints the published text as ids are selected; a UTF-8 character split over ids waits for its end.

    On a terminal the text is escaped (`terminal_text`): an imported model can select the bytes of an escape
    sequence (ESC ] 0; ... BEL retitles the window). A pipe or a file gets the decoded text exactly.
    """

    def __init__(self, tokenizer, turn_end_id: int):
        self.tokenizer, self.turn_end_id = tokenizer, turn_end_id
        self.ids: list[int] = []
        self.decoder = tokenizer.incremental_decoder()  # each id's text once, not the whole text again per id
        self.decoded = 0  # ids given to the decoder
        self.shown = terminal_text if _is_terminal(sys.stdout) else str

    def select(self, row: int, token_id: int) -> None:
        if token_id == self.turn_end_id:
            return
        self.ids.append(token_id)
        sys.stdout.write(self.shown(self._added()))
        sys.stdout.flush()

    def _added(self) -> str:
        """The text of the ids the decoder has not had yet."""
        text = self.decoder.add(self.ids[self.decoded :])
        self.decoded = len(self.ids)
        return text

    def finish(self, response) -> None:
        decoded = self.tokenizer.decode(self.ids)  # for its note on malformed bytes
        outcome = response.outcome
        print(self.shown(self._added() + self.decoder.finish()))
        note = f"; {decoded.note}" if decoded.note else ""
        print(
            f"[{outcome.stop_reason}: {outcome.selected_tokens} selected, {outcome.published_tokens} published{note}]",
            file=sys.stderr,
        )
        if response.speculation is not None:
            s = response.speculation
            rate = "" if s.acceptance_rate is None else f" ({s.acceptance_rate:.0%})"
            print(f"[speculative, K={s.speculate}: {len(s.rounds)} rounds, {s.accepted} of {s.drafted} drafted ids accepted{rate}]",
                  file=sys.stderr)  # fmt: skip
        for observation in response.observations:
            print(f"  {observation.id}  {observation.operation}  shape={list(observation.shape)}", file=sys.stderr)


def _response_json(response, tokenizer, execution) -> dict:
    from inference.backend import ExecutionBackend, ExecutionProvenance

    backend = ExecutionBackend.current(execution.identity.precision)
    decoded = tokenizer.decode(list(response.published_ids))
    return {
        "request_id": response.request_id,
        "prompt_ids": list(response.prompt_ids),
        "output_ids": list(response.output_ids),
        "published_ids": list(response.published_ids),
        "text": decoded.text,
        "decoding_note": decoded.note,
        "outcome": response.outcome.to_json(),
        "selections": [s.to_json() for s in response.selections],
        "computations": [c.to_json() for c in response.computations],
        "work": response.work.to_json(),
        "observations": [o.to_json() for o in response.observations],
        **({} if response.speculation is None else {"speculation": response.speculation.to_json()}),
        "state": {
            "checkpoint_sha256": execution.identity.checkpoint_sha256,
            "tokenizer_sha256": execution.identity.tokenizer_sha256,
            "precision": execution.identity.precision,
        },
        "execution": {
            "backend": backend.to_json(),
            "kernels": execution.kernels.to_json(),
            "provenance": ExecutionProvenance.current(backend).to_json(),
        },
    }


COMMANDS = {"generate": _generate, "record": _record, "serve": _serve}
ARGUMENTS = {"generate": _generate_arguments, "record": _record_arguments, "serve": _serve_arguments}
