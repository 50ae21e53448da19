"""Arms decoded with `generate` on the wall clock: greedy or speculative decoding of a lab's requests.

A generate arm (`execution.runner=generate`) decodes each request of the lab's
workload alone (batch 1), with the prompt its recording holds, once untimed and
then `REPEATS` times:
greedy decoding (`inference.generation.generate`) or greedy-exact speculative
decoding (`inference.speculative.generate_speculative`) with the arm's draft and K.
Its decoding run (`decoding-run-N.json`) holds every request's output ids, rounds,
drafted and accepted ids and measured times; its totals are the arm's outcomes:
acceptance rate, ids per round, decode tokens/s, and whether every request's ids are
the recording's, which greedy decoding selected (checked, not assumed: speculative
decoding must select exactly greedy's ids).

Nothing measured can be measured again: a replay checks the file, that it decoded
the recording's prompts with the arm's decoding, and derives its totals again,
the comparison with the recorded ids included.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.arm_recording import Recording, generation_of
from experiments.controls import chosen
from experiments.experiment_spec import ExecutionSpec
from experiments.lab_workload import LabWorkload
from experiments.record_files import dumps, file_entry, verified_file
from jgpt.foundation.errors import ApiError
from jgpt.foundation.json_input import parse_json
from jgpt.foundation.validation import is_integer, is_number

if TYPE_CHECKING:  # the plan's module imports jax, which a replay never needs
    from jgpt.kernels.plan import Kernels

FORMAT = "jgpt-decoding-run"
VERSION = 1
REPEATS = 3  # decodes of the workload per arm; an arm's time is the median of their sums
MEASUREMENT = (
    "each request alone (batch 1), decoded once untimed, then REPEATS times; "
    "decode_us: the decode loop from dispatch to ready, plus a draft model's own prefill; prefill_us: the "
    "target's prefill"
)
# check_draft names its fields for the CLI; an arm names the controls that set them
CONTROL_OF = {"speculate": "decoding.speculation_tokens", "draft": "decoding.draft_model_id"}


def decoding_of(execution: ExecutionSpec) -> dict[str, Any]:
    """The arm's decoding: rule, draft and K (greedy: neither)."""
    assignments = execution.assignments
    if chosen(assignments, "decoding.rule") == "greedy":
        return {"rule": "greedy", "draft_model_id": None, "speculation_tokens": None}
    return {
        "rule": "speculative",
        "draft_model_id": chosen(assignments, "decoding.draft_model_id"),
        "speculation_tokens": chosen(assignments, "decoding.speculation_tokens"),
    }


def decoding_arm(
    i: int,
    label: str,
    execution: ExecutionSpec,
    n: int,
    recording: Recording,
    workload: LabWorkload,
    files: dict[str, bytes],
    kernels: Kernels,
) -> dict[str, Any]:
    """Decode the arm's requests REPEATS times under the kernel plan `kernels` (the target's and a draft model's);
    its outcomes are the decoding run's totals."""
    try:
        run = _decode(execution, recording, workload, kernels)
    except ApiError as error:
        raise ApiError(f"arm {label!r}: {CONTROL_OF.get(error.field, error.field)}", error.reason) from None
    name = f"decoding-run-{i}.json"
    files[name] = dumps(run)
    return {
        "label": label,
        "execution": execution.to_json(),
        "recording": n,
        "decoding_run": file_entry(name, files[name]),
        "outcomes": run["totals"],
    }


def _decode(execution: ExecutionSpec, recording: Recording, workload: LabWorkload, kernels: Kernels) -> dict[str, Any]:
    # Start-up cost only: these import jax, which a replay never needs; an arm that decodes does.
    from experiments.engine_serving import model_execution, served_requests
    from inference.generation import generate
    from inference.speculative import PROMPT_LOOKUP, PromptLookup, check_draft, generate_speculative

    decoding = decoding_of(execution)
    target, _ = model_execution(recording.model["model_id"], kernels)
    requests = served_requests(workload, recording.document, generation_of(execution))
    if decoding["rule"] == "greedy":
        run, draft_sha256 = lambda request: generate(target, [request]), None  # noqa: E731
    else:
        draft_id, k = decoding["draft_model_id"], decoding["speculation_tokens"]
        draft = PromptLookup() if draft_id == PROMPT_LOOKUP else model_execution(draft_id, kernels)[0]
        check_draft(target, draft, k)
        draft_sha256 = None if isinstance(draft, PromptLookup) else draft.identity.checkpoint_sha256
        run = lambda request: generate_speculative(target, draft, [request], k)  # noqa: E731
    for request in requests:  # XLA on CPU prepares a program's kernels on its first runs: one pass is not timed
        run(request)
    repeats = [[run(request).responses[0] for request in requests] for _ in range(REPEATS)]
    entries = []
    for index, request in enumerate(requests):
        responses = [responses[index] for responses in repeats]
        last = responses[-1]
        evidence = last.speculation
        entries.append({
            "request_id": request.request_id, "prompt_ids": list(request.prompt_ids), "output_ids": list(last.output_ids),
            "same_ids_every_repeat": all(r.output_ids == last.output_ids for r in responses),
            "rounds": len(last.computations) - 1 if evidence is None else len(evidence.rounds),
            "drafted": 0 if evidence is None else evidence.drafted, "accepted": 0 if evidence is None else evidence.accepted,
            "prefill_us": [r.computations[0].wall_time_us for r in responses],
            "decode_us": [_decode_us(r) for r in responses],
        })  # fmt: skip
    run_document = {"format": FORMAT, "version": VERSION, "model": recording.document["model"],
                    "decoding": decoding | {"draft_checkpoint_sha256": draft_sha256}, "repeats": REPEATS,
                    "measurement": MEASUREMENT, "requests": entries}  # fmt: skip
    return run_document | {"totals": totals(entries, recording.document)}


def _decode_us(response) -> float:
    """The decode loop's time (its works share it) plus a draft model's prefill, which greedy does not run."""
    draft = 0.0 if response.speculation is None else response.speculation.draft_prefill_wall_time_us
    return sum(c.wall_time_us for c in response.computations[1:]) + draft


def totals(entries: Sequence[Mapping[str, Any]], document: Mapping[str, Any]) -> dict[str, Any]:
    """What an arm's outcomes are: ids, rounds, acceptance, decode tokens/s (median over repeats of the summed
    decode times), and whether every request selected the ids its greedy recording holds, every repeat."""
    recorded = {r["request_id"]: r["output_ids"] for r in document["requests"]}
    output_ids = sum(len(e["output_ids"]) for e in entries)
    decode_ids = output_ids - len(entries)  # each first id is the prefill's
    rounds, drafted = sum(e["rounds"] for e in entries), sum(e["drafted"] for e in entries)
    accepted = sum(e["accepted"] for e in entries)
    decode_us = statistics.median(sum(column) for column in zip(*(e["decode_us"] for e in entries)))
    return {
        "requests": len(entries), "output_ids": output_ids, "decode_ids": decode_ids, "rounds": rounds,
        "drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / drafted if drafted else None,
        "ids_per_round": decode_ids / rounds if rounds else None, "decode_us": decode_us,
        "decode_tokens_per_s": decode_ids / decode_us * 1e6 if decode_us > 0 else None,
        "same_ids_as_greedy": all(e["same_ids_every_repeat"] and e["output_ids"] == recorded.get(e["request_id"])
                                  for e in entries),
    }  # fmt: skip


def summary_row(arm: Mapping[str, Any], greedy_rate: float | None) -> dict[str, Any]:
    """A generate arm's row of summary.json; `greedy_rate` is the record's greedy generate arm's decode tokens/s."""
    totals, decoding = arm["outcomes"], decoding_of(ExecutionSpec.from_json(arm["execution"], "execution"))
    rate = totals["decode_tokens_per_s"]
    return (
        {
            "label": arm["label"],
            "rule": decoding["rule"],
            "draft": decoding["draft_model_id"],
            "speculation_tokens": decoding["speculation_tokens"],
        }
        | {
            name: totals[name]
            for name in ("requests", "decode_ids", "rounds", "acceptance_rate", "ids_per_round", "decode_tokens_per_s")
        }
        | {
            "vs_greedy": rate / greedy_rate if rate and greedy_rate else None,
            "same_ids_as_greedy": totals["same_ids_as_greedy"],
        }
    )


def greedy_rate(arms: Sequence[Mapping[str, Any]]) -> float | None:
    """The decode tokens/s of the record's first greedy generate arm, which every arm is compared with."""
    greedy = [
        arm
        for arm in arms
        if "decoding_run" in arm
        and decoding_of(ExecutionSpec.from_json(arm["execution"], "execution"))["rule"] == "greedy"
    ]
    return greedy[0]["outcomes"]["decode_tokens_per_s"] if greedy else None


def replay_decoding_arm(
    directory: Path, arm: Mapping[str, Any], field: str, execution: ExecutionSpec, document: dict
) -> None:
    """A generate arm cannot be measured again: its decoding run is intact, decoded the recording's prompts
    with the arm's model and decoding, and its totals (same ids as greedy included) are what its requests give."""
    entry = arm.get("decoding_run")
    data = verified_file(directory, entry, f"{field}.decoding_run")
    if not isinstance(entry, dict) or set(entry) != {"path", "sha256", "bytes"}:
        raise ApiError(f"{field}.decoding_run", "must be a file entry {path, sha256, bytes}")
    run = parse_json(data, f"{field}.decoding_run")
    at = f"{field}.decoding_run"
    if not isinstance(run, dict) or run.get("format") != FORMAT or run.get("version") != VERSION:
        raise ApiError(f"{at}.format", f"not a {FORMAT} version {VERSION} document")
    if run.get("model") != document.get("model"):
        raise ApiError(f"{at}.model", "is not the model of the arm's recorded computations")
    decoding = run.get("decoding")
    if (
        not isinstance(decoding, dict)
        or {k: v for k, v in decoding.items() if k != "draft_checkpoint_sha256"} != decoding_of(execution)
        or not (decoding.get("draft_checkpoint_sha256") is None or isinstance(decoding["draft_checkpoint_sha256"], str))
    ):
        raise ApiError(f"{at}.decoding", "is not the decoding the arm's controls choose")
    if run.get("repeats") != REPEATS or run.get("measurement") != MEASUREMENT:
        raise ApiError(f"{at}.repeats", f"must be {REPEATS} repeats measured as {FORMAT} {VERSION} measures")
    entries = _entries(run.get("requests"), document, f"{at}.requests")
    if run.get("totals") != totals(entries, document) or arm.get("outcomes") != run["totals"]:
        raise ApiError(f"{field}.outcomes", "are not the totals of its decoding run's requests")
    if set(run) != {"format", "version", "model", "decoding", "repeats", "measurement", "requests", "totals"}:
        raise ApiError(at, "holds other fields than a decoding run's")


REQUEST_FIELDS = {
    "request_id",
    "prompt_ids",
    "output_ids",
    "same_ids_every_repeat",
    "rounds",
    "drafted",
    "accepted",
    "prefill_us",
    "decode_us",
}


def _entries(value: Any, document: Mapping[str, Any], field: str) -> list[dict[str, Any]]:
    """The run's requests: the recording's, in its order, with their prompts, and well-formed counts and times."""
    recorded = [(r["request_id"], r["prompt_ids"]) for r in document["requests"]]
    if not isinstance(value, list) or len(value) != len(recorded):
        raise ApiError(field, f"must list the {len(recorded)} requests of the recording")
    for i, (entry, (request_id, prompt_ids)) in enumerate(zip(value, recorded)):
        at = f"{field}[{i}]"
        if not isinstance(entry, dict) or set(entry) != REQUEST_FIELDS:
            raise ApiError(at, f"must be an object with exactly {', '.join(sorted(REQUEST_FIELDS))}")
        if entry["request_id"] != request_id or entry["prompt_ids"] != prompt_ids:
            raise ApiError(at, f"did not decode the recording's request {request_id!r} with its prompt")
        counts = [entry[name] for name in ("rounds", "drafted", "accepted")]
        ids = entry["output_ids"]
        if (
            not all(is_integer(c) and c >= 0 for c in counts)
            or not isinstance(ids, list)
            or not ids
            or not all(is_integer(t) for t in ids)
            or not isinstance(entry["same_ids_every_repeat"], bool)
        ):
            raise ApiError(at, "needs output ids, whole counts of rounds, drafted and accepted ids, and a boolean")
        times = [entry["prefill_us"], entry["decode_us"]]
        if not all(
            isinstance(t, list) and len(t) == REPEATS and all(is_number(x) and x >= 0 for x in t) for t in times
        ):
            raise ApiError(at, f"prefill_us and decode_us must each be {REPEATS} times in microseconds")
    return value
