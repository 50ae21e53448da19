"""The recorded computation document: analytic counts, prefix reuse across requests, the CLI faces."""

from __future__ import annotations

import json

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from inference.execution import ModelExecution, advance
from inference.recorded_computations import FORMAT, read_workload, record
from jgpt.artifacts.artifact import save_artifact
from jgpt.cli import main as cli
from jgpt.foundation.errors import ApiError
from jgpt.kernels import blas_matvec
from jgpt.kernels.plan import Kernels
from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.model.kv_state import StateIdentity
from jgpt.model.weights import initialize
from jgpt.tokenizers.tokenizer import Tokenizer

GPT = ModelArchitecture(vocabulary=260, width=32, ffn=64, context=64, layers=2, heads=4)
LLAMA = LlamaArchitecture(vocabulary=260, width=32, ffn=48, context=64, layers=2, heads=4, kv_heads=2)
CONVERSATION = [
    {"role": "user", "text": "Hi"},
    {"role": "assistant", "text": "Hello."},
    {"role": "user", "text": "Add 2 and 3"},
]
WORKLOAD = {
    "kind": "requests",
    "requests": [
        {
            "request_id": "a",
            "arrival_us": 0,
            "request": {"turns": CONVERSATION[:1], "generation": {"max_new_tokens": 4}},
        },
        {"request_id": "b", "arrival_us": 5, "request": {"turns": CONVERSATION, "generation": {"max_new_tokens": 3}}},
        {"request_id": "c", "arrival_us": 5, "request": {"text": "Hi", "generation": {"max_new_tokens": 2}}},
    ],
}


@pytest.fixture(scope="module")
def artifact_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("artifact") / "gpt"
    weights, provenance = initialize(GPT, seed=11)
    save_artifact(path, GPT, weights, provenance, Tokenizer.bytes_only())
    return path


@pytest.fixture(scope="module")
def document(artifact_dir):
    from inference.commands import _load

    execution, tokenizer, _ = _load(str(artifact_dir))
    return record(execution, read_workload(WORKLOAD, tokenizer), tokenizer=tokenizer)


def analytic_matmul_flops(a, start: int, stop: int) -> int:
    """Positions start..stop-1 processed, each attending causally to itself and all before it."""
    q_width = a.heads * a.head_dim
    projections = 2 * a.width * (q_width + 2 * a.kv_width) + 2 * q_width * a.width
    feed_forward = (3 if a.activation == "swiglu" else 2) * 2 * a.width * a.ffn
    total = 0
    for p in range(start, stop):
        attention = 2 * (p + 1) * q_width * 2  # scores and weighted values
        total += a.layers * (projections + feed_forward + attention) + 2 * a.width * a.vocabulary
    return total


def test_document_counts_equal_the_analytic_definition(document):
    assert document["format"] == FORMAT and document["version"] == 1
    for request in document["requests"]:
        prompt = len(request["prompt_ids"])
        prefill, *decodes = request["computations"]
        reused = prefill["reused_positions"]
        assert prefill["matmul_flops"] == analytic_matmul_flops(GPT, reused, prompt)
        assert prefill["reference_matmul_flops"] == analytic_matmul_flops(GPT, 0, prompt)
        assert len(decodes) == len(request["output_ids"]) - 1 == len(request["decode_steps"])
        for k, (work, step) in enumerate(zip(decodes, request["decode_steps"]), start=1):
            position = prompt + k - 1
            assert step["position"] == position and work["phase"] == "decode"
            assert work["matmul_flops"] == step["matmul_flops"] == analytic_matmul_flops(GPT, position, position + 1)
            assert work["reference_matmul_flops"] == analytic_matmul_flops(GPT, 0, position + 1)
            assert work["logical_memory_bytes"] == step["logical_memory_bytes"]
            assert work["input_ids"] == [request["output_ids"][k - 1]]


def test_per_position_costs_give_the_cost_of_any_reuse(document):
    for request in document["requests"]:
        costs = request["prefill_costs"]
        prefill = request["computations"][0]
        r = prefill["reused_positions"]
        assert prefill["matmul_flops"] == costs["fixed_matmul_flops"] + sum(costs["position_matmul_flops"][r:])
        assert prefill["logical_memory_bytes"] == costs["fixed_memory_bytes"] + sum(costs["position_memory_bytes"][r:])
        assert prefill["reference_matmul_flops"] == sum(costs["position_matmul_flops"])
    a = GPT
    assert document["kv_bytes_per_position"] == 2 * a.layers * a.kv_width * 4


def test_whole_sequences_of_earlier_requests_are_reused_once_and_stay_exact(document, artifact_dir):
    """The reuse rule: an ended request retains every position it computed (prompt and all selected ids
    but the last), a prompt reuses the longest retained proper prefix, and a hit takes the state."""
    a, b, c = document["requests"]
    # b resends a's prompt with a reply the model did not give, and c repeats a's prompt: neither extends
    # a retained sequence (a prompt-only state is never retained, and a whole-prompt match is not a hit).
    assert b["prompt_ids"][: len(a["prompt_ids"])] == a["prompt_ids"] and c["prompt_ids"] == a["prompt_ids"]
    assert [r["computations"][0]["reused_positions"] for r in (a, b, c)] == [0, 0, 0]
    assert c["output_ids"] == a["output_ids"][:2]
    outcome = b["outcome"]
    assert outcome["selected_tokens"] + outcome["unused_budget"] == b["max_new_tokens"]

    from inference.commands import _load
    from inference.policy import GenerationPolicy, InferenceRequest

    execution = _load(str(artifact_dir)).execution
    sequence = tuple(a["prompt_ids"] + a["output_ids"][:-1])
    continued = record(
        execution,
        [
            InferenceRequest("a", tuple(a["prompt_ids"]), GenerationPolicy(4)),
            InferenceRequest("d", (*sequence, 100, 101), GenerationPolicy(3)),
            InferenceRequest("e", (*sequence, 100, 101, 102), GenerationPolicy(2)),
        ],
    )
    a2, d, e = continued["requests"]
    assert a2["output_ids"] == a["output_ids"]
    # d continues a's whole sequence; e would too, but d took that state, and d's own retained sequence
    # runs past its prompt (d selected more than one id), so it is no prefix of e's.
    assert len(d["output_ids"]) > 1
    assert [r["computations"][0]["reused_positions"] for r in (a2, d, e)] == [0, len(sequence), 0]
    errors = [w["reference_max_abs_error"] for r in (*document["requests"], d) for w in r["computations"]]
    assert max(errors) <= 1e-5


def test_document_identifies_model_and_execution(document, artifact_dir):
    model = document["model"]
    manifest = json.loads((artifact_dir / "manifest.json").read_text())
    assert model["architecture"] == GPT.to_json()
    assert model["checkpoint_sha256"] in json.dumps(manifest)
    backend = document["execution"]["backend"]
    assert backend["precision"] == "float32" and backend["library"].startswith("jax ")
    # The kernel plan that ran: auto, bound to this tiny model (its blocks are below the fused kernel's size).
    one_row = "kernel" if blas_matvec.available() else "xla"
    assert document["execution"]["kernels"] == Kernels(one_row=one_row).to_json()
    provenance = document["execution"]["provenance"]
    assert set(provenance) >= {"python", "revision", "source_sha256", "sources"}
    assert "inference/generation.py" in provenance["sources"]
    for request in document["requests"]:
        assert all(w["wall_time_us"] > 0 and w["measurement_boundary"] for w in request["computations"])


@pytest.mark.parametrize("architecture", [GPT, LLAMA], ids=["gpt", "llama"])
def test_jaxpr_matmul_flops_of_a_decode_equal_the_recorded_count(architecture):
    """Count dot_general FLOPs in the traced decode work; a cache of exactly p + 1 slots executes no padding."""
    weights, _ = initialize(architecture, seed=0)
    execution = ModelExecution(weights, architecture, StateIdentity("c", "t", "float32"))
    position = 9
    state = execution.empty_state(batch=1, capacity=position + 1).replace(lengths=jnp.asarray([position], jnp.int32))
    jaxpr = jax.make_jaxpr(
        lambda w, s: advance(w, architecture, s, jnp.ones((1, 1), jnp.int32), jnp.ones(1, jnp.int32), True)
    )(weights, state)
    assert _dot_flops(jaxpr.jaxpr) == execution.costs.matmul_flops(position, position + 1)


def _dot_flops(jaxpr) -> int:
    total = 0
    for equation in jaxpr.eqns:
        if equation.primitive.name == "dot_general":
            (contracting, _), _ = equation.params["dimension_numbers"]
            lhs = equation.invars[0].aval.shape
            total += 2 * int(np.prod(equation.outvars[0].aval.shape)) * int(np.prod([lhs[d] for d in contracting]))
        repeat = equation.params.get("length", 1) if equation.primitive.name == "scan" else 1
        for sub in jax.extend.core.jaxprs_in_params(equation.params):
            total += repeat * _dot_flops(sub)
    return total


@pytest.mark.parametrize(
    "workload, field",
    [
        ({"kind": "requests"}, "workload.requests"),
        ({"kind": "requests", "requests": [{"request_id": "x", "arrival_us": -1, "request": {"text": "a"}}]},
         "workload.requests[0].arrival_us"),
        ({"kind": "requests", "requests": [{"request_id": "x", "arrival_us": 0, "request": {"text": "a", "colour": 1}}]},
         "workload.requests[0].request.colour"),
        ({"kind": "requests", "requests": [{"request_id": "x", "arrival_us": 0, "request": {}}]},
         "workload.requests[0].request"),
        ({"kind": "requests", "requests": [
            {"request_id": "x", "arrival_us": 0, "request": {"text": "a", "generation": {"max_new_tokens": 0}}}]},
         "max_new_tokens"),
    ],
    ids=["no-requests", "negative-arrival", "unknown-field", "no-input", "zero-budget"],
)  # fmt: skip
def test_bad_workloads_are_refused_naming_the_field(workload, field):
    with pytest.raises(ApiError) as refused:
        read_workload(workload, Tokenizer.bytes_only())
    assert refused.value.field == field


def run_cli(capsys, *args):
    """The umbrella command in this process (it shares the compiled programs): (exit code, stdout, stderr)."""
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_record_cli_writes_the_document_and_refuses_bad_input_without_output(artifact_dir, tmp_path, capsys):
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(WORKLOAD))
    out = tmp_path / "computations.json"
    code, _, err = run_cli(capsys, "record", str(workload), "--out", str(out), "--model", str(artifact_dir))
    assert code == 0, err
    written = json.loads(out.read_text())
    assert [r["request_id"] for r in written["requests"]] == ["a", "b", "c"]

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "requests", "requests": [
        {"request_id": "x", "arrival_us": 0, "request": {"prompt_ids": [1, 999]}}]}))  # fmt: skip
    refused_out = tmp_path / "refused.json"
    code, _, err = run_cli(capsys, "record", str(bad), "--out", str(refused_out), "--model", str(artifact_dir))
    assert code == 2 and "999" in err and err.count("\n") == 1
    assert not refused_out.exists()


def test_generate_cli_json_and_plain(artifact_dir, capsys):
    code, out, err = run_cli(
        capsys, "generate", "--model", str(artifact_dir), "--max-new-tokens", "3", "--json", "--observe", "1", "Hi"
    )
    assert code == 0, err
    response = json.loads(out)
    assert len(response["output_ids"]) == 3 and response["outcome"]["stop_reason"] == "max_new_tokens"
    assert [c["phase"] for c in response["computations"]] == ["prefill", "decode", "decode"]
    assert {o["step"] for o in response["observations"]} == {1}
    assert max(c["reference_max_abs_error"] for c in response["computations"]) <= 1e-5
    assert response["execution"]["kernels"]["decode"] == "xla"  # this tiny model's blocks are below the kernel's size

    code, out, err = run_cli(
        capsys, "generate", "--model", str(artifact_dir), "--max-new-tokens", "3", "--json", "--kernels", "xla", "Hi"
    )
    assert code == 0, err
    assert json.loads(out)["execution"]["kernels"] == Kernels.xla().to_json()
    assert json.loads(out)["output_ids"] == response["output_ids"]

    code, out, err = run_cli(
        capsys, "generate", "--model", str(artifact_dir), "--max-new-tokens", "3", "--ids", "257,72,105,259,258"
    )
    assert code == 0, err
    assert "max_new_tokens: 3 selected" in err
    selected = generate_ids(artifact_dir, [257, 72, 105, 259, 258], 3)
    assert out.rstrip("\n") == Tokenizer.bytes_only().decode(selected).text  # the streamed text, all of it

    code, _, err = run_cli(capsys, "generate", "--model", str(artifact_dir), "--ids", "257,,1")
    assert code == 2 and "ids" in err and err.count("\n") == 1


def test_generate_refuses_an_observe_step_the_generation_never_reached(artifact_dir, capsys):
    """It used to print no observations and exit 0. The context (64) ends this generation after a few steps."""
    ids = ",".join(map(str, [257] + [72] * 58 + [259, 258]))
    code, _, err = run_cli(capsys, "generate", "--model", str(artifact_dir), "--max-new-tokens", "10", "--json",
                           "--observe", "8", "--ids", ids)  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "observe: step 8 was not reached: generation ended after" in err


def generate_ids(artifact_dir, prompt, budget):
    from inference.commands import _load
    from inference.generation import generate
    from inference.policy import GenerationPolicy, InferenceRequest

    execution = _load(str(artifact_dir)).execution
    (response,) = generate(execution, [InferenceRequest("x", prompt, GenerationPolicy(budget))]).responses
    return [t for t in response.output_ids if t != execution.turn_end_id]


def test_kvsim_reads_the_document(document):
    from kvsim.recorded import parse_document

    parsed = parse_document(json.loads(json.dumps(document)))
    assert [r.request_id for r in parsed.requests] == ["a", "b", "c"]
    for request, recorded in zip(document["requests"], parsed.requests):
        reused = request["computations"][0]["reused_positions"]
        assert recorded.prefill_cost(reused)[0] == request["computations"][0]["matmul_flops"]
        assert recorded.output_token_bytes == tuple(1 if t < 256 else 0 for t in request["output_ids"])
