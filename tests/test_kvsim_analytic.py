"""kvsim's analytic counts: equal to what `jgpt record` counts for the same architecture, read from a jgpt
artifact, architecture JSON or Hugging Face config.json, and the worked numbers docs/kvsim.md gives."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jgpt.foundation import units
from jgpt.foundation.errors import ApiError
from kvsim.analytic import AnalyticModel, Conversation, analytic_computations
from kvsim.model_config import hf_model, jgpt_model, read_model_config
from kvsim.recorded import request_json

ROOT = Path(__file__).resolve().parents[1]

# The architectures the recorder counts (tests/test_inference_record.py's shapes), each at a precision.
GPT = {"vocabulary": 260, "width": 32, "ffn": 64, "context": 64, "layers": 2, "heads": 4, "position": "learned"}
GROUPED_LLAMA = {"vocabulary": 260, "width": 32, "ffn": 48, "context": 64, "layers": 2, "heads": 4, "kv_heads": 2,
                 "position": "rope"}  # fmt: skip
# Mistral's window and Qwen2's query/key/value biases, which bound and add to what the recorder counts.
WINDOWED = {**GROUPED_LLAMA, "sliding_window": 8, "attention_bias": True}
WORKLOAD = {
    "kind": "requests",
    "requests": [
        {"request_id": "a", "arrival_us": 0, "request": {"text": "Hi", "generation": {"max_new_tokens": 4}}},
        {"request_id": "b", "arrival_us": 5, "request": {"text": "Hi there, and more", "generation": {"max_new_tokens": 3}}},
    ],
}  # fmt: skip
COUNTED = ("prefill_costs", "decode_steps")

# Published config.json fields (the ones the analytic model reads) of the models docs/kvsim.md works through.
LLAMA_3_8B = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "intermediate_size": 14336, "vocab_size": 128256, "num_hidden_layers": 32,
              "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
              "hidden_act": "silu", "rope_theta": 500000.0}  # fmt: skip
GPT2_SMALL = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
              "vocab_size": 50257, "activation_function": "gelu_new"}  # fmt: skip
QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 96, "vocab_size": 300, "num_hidden_layers": 2, "max_position_embeddings": 128,
         "torch_dtype": "bfloat16", "tie_word_embeddings": True, "use_sliding_window": False,
         "sliding_window": 128}  # fmt: skip
MISTRAL = {**LLAMA_3_8B, "model_type": "mistral", "vocab_size": 32768, "sliding_window": None}


def recorded(architecture: dict, precision: str, directory: Path) -> tuple[dict, Path]:
    """The document `jgpt record` writes for WORKLOAD on a random model of `architecture` at `precision`, and
    the artifact's directory."""
    from inference.commands import _load
    from inference.recorded_computations import read_workload, record
    from jgpt.artifacts.artifact import save_artifact
    from jgpt.model.architecture import architecture_from_json
    from jgpt.model.weights import initialize
    from jgpt.tokenizers.tokenizer import Tokenizer

    a = architecture_from_json({**architecture, "precision": precision})
    weights, provenance = initialize(a, seed=3)
    save_artifact(directory, a, weights, provenance, Tokenizer.bytes_only())
    loaded = _load(str(directory))
    return record(loaded.execution, read_workload(WORKLOAD, loaded.tokenizer), tokenizer=loaded.tokenizer), directory


def analytic_document(model: AnalyticModel, document: dict) -> list[dict]:
    """The analytic model's requests for the same ids the recorded document holds."""
    items = [
        Conversation(r["request_id"], r["arrival_us"], tuple(r["prompt_ids"]), tuple(r["output_ids"]),
                     r["max_new_tokens"], r["outcome"]["complete"])
        for r in document["requests"]
    ]  # fmt: skip
    return [request_json(r) for r in analytic_computations(model, items, "test").requests]


def count_table(name: str, document: dict, model: AnalyticModel) -> list[str]:
    """Each request's works, recorded and analytic: the prefill's fixed part and each of its positions, and
    each decode step, one row each."""
    rows = [f"{name}: kv_bytes_per_position recorded {document['kv_bytes_per_position']} "
            f"analytic {model.kv_bytes_per_position}",
            f"{'request':>7} {'work':>14} {'recorded FLOPs':>15} {'analytic FLOPs':>15} {'recorded bytes':>15} "
            f"{'analytic bytes':>15}"]  # fmt: skip
    for request, mine in zip(document["requests"], analytic_document(model, document)):
        works = []
        for side in (request, mine):
            prefill = side["prefill_costs"]
            works.append(
                [("prefill fixed", prefill["fixed_matmul_flops"], prefill["fixed_memory_bytes"])]
                + [(f"prefill p={p}", *counts) for p, counts in
                   enumerate(zip(prefill["position_matmul_flops"], prefill["position_memory_bytes"]))]
                + [(f"decode p={s['position']}", s["matmul_flops"], s["logical_memory_bytes"])
                   for s in side["decode_steps"]]
            )  # fmt: skip
        rows += [f"{request['request_id']:>7} {w:>14} {rf:>15} {af:>15} {rb:>15} {ab:>15}"
                 for (w, rf, rb), (_, af, ab) in zip(*works)]  # fmt: skip
    return rows


@pytest.mark.parametrize(
    ("architecture", "precision"),
    [
        (GPT, "float32"),
        (GPT, "bfloat16"),
        (GROUPED_LLAMA, "float32"),
        (GROUPED_LLAMA, "bfloat16"),
        (WINDOWED, "bfloat16"),
    ],
    ids=["gpt-f32", "gpt-bf16", "grouped-llama-f32", "grouped-llama-bf16", "windowed-biased-llama-bf16"],
)
def test_analytic_counts_equal_what_jgpt_record_counts(tmp_path, architecture, precision):
    document, directory = recorded(architecture, precision, tmp_path / "model")
    model = read_model_config(directory)
    assert model.kv_bytes_per_position == document["kv_bytes_per_position"]
    mine = analytic_document(model, document)
    assert [{k: r[k] for k in COUNTED} for r in mine] == [{k: r[k] for k in COUNTED} for r in document["requests"]]
    assert any(r["decode_steps"] for r in mine)


def test_the_recorders_costs_are_the_analytic_models_at_every_position(tmp_path):
    """WorkCosts (inference/costs.py) of a loaded model against the analytic model, past the positions a
    recording reaches, one key/value head included."""
    from inference.commands import _load
    from jgpt.artifacts.artifact import save_artifact
    from jgpt.model.architecture import architecture_from_json
    from jgpt.model.weights import initialize

    for i, architecture in enumerate((GPT, GROUPED_LLAMA, {**GROUPED_LLAMA, "kv_heads": 1}, WINDOWED)):
        a = architecture_from_json(architecture)
        weights, provenance = initialize(a, seed=0)
        save_artifact(tmp_path / str(i), a, weights, provenance)
        for name, precision in (("f32", "float32"), ("bf16", "bfloat16")):  # as `--precision` names them
            costs = _load(str(tmp_path / str(i)), name).execution.costs
            model = jgpt_model({**architecture, "precision": precision}, str)
            for p in (0, 1, 17, 63):
                assert costs.position_matmul_flops(p) == model.position_flops(p)
                assert costs.position_memory_bytes(p) == model.position_bytes(p)
                assert costs.matmul_flops(p, p + 1) == model.decode_flops(p)
                assert costs.memory_bytes(p, p + 1) == model.decode_bytes(p)
            assert costs.fixed_memory_bytes == model.fixed_memory_bytes
            assert (costs.matmul_flops(0, 40), costs.memory_bytes(0, 40)) == model.prefill(40)


@pytest.mark.parametrize("config", [GPT2_SMALL, LLAMA_3_8B, {**LLAMA_3_8B, "num_key_value_heads": None}])
def test_a_hugging_face_config_counts_as_jgpt_imports_it(config):
    """The architecture `jgpt import-hf` makes of config.json counts as the config itself does."""
    from jgpt.artifacts.hf_import import _gpt2_architecture, _llama_architecture

    architecture = (_gpt2_architecture if config["model_type"] == "gpt2" else _llama_architecture)(config)
    imported = jgpt_model(architecture.to_json(), str)
    read = hf_model(config, str)
    assert dataclasses.replace(read, tied_embeddings=False) == imported  # jgpt's import copies a tied head


def test_grouped_heads_divide_the_kv_bytes_and_gating_adds_a_matrix():
    full = hf_model({**LLAMA_3_8B, "num_key_value_heads": 32}, str)
    grouped = hf_model(LLAMA_3_8B, str)
    assert full.kv_bytes_per_position == 4 * grouped.kv_bytes_per_position == 2 * 32 * 4096 * 2
    ungated = dataclasses.replace(grouped, gated=False)
    assert grouped.dense_flops_per_position - ungated.dense_flops_per_position == 32 * 2 * 4096 * 14336
    own_head = hf_model({**LLAMA_3_8B, "head_dim": 64}, str)  # a head width apart from width / heads
    assert own_head.kv_bytes_per_position == grouped.kv_bytes_per_position // 2
    assert own_head.attention_flops_per_key == grouped.attention_flops_per_key // 2


def test_qwen2_biases_and_a_tied_head():
    model = hf_model(QWEN2, str)
    assert (model.biases, model.tied_embeddings, model.precision_bytes) == ("query_key_value", True, 2)
    assert model.kv_width == 2 * 64 // 4
    untied = dataclasses.replace(model, tied_embeddings=False)
    assert untied.parameters - model.parameters == 64 * 300  # a tied head is the token table, counted once
    assert untied.weight_bytes == model.weight_bytes  # jgpt holds a copy either way
    unbiased = dataclasses.replace(model, biases="none")
    assert model.fixed_memory_bytes - unbiased.fixed_memory_bytes == 2 * (4 * 16 + 2 * 2 * 16) * 4  # float32
    assert hf_model(MISTRAL, str).biases == "none"


def test_an_artifact_a_manifest_an_architecture_and_a_config_directory_are_read(tmp_path):
    chat = ROOT / "checkpoints" / "chat"
    architecture = json.loads((chat / "manifest.json").read_text())["architecture"]
    (tmp_path / "architecture.json").write_text(json.dumps(architecture))
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(LLAMA_3_8B))
    expected = jgpt_model(architecture, str)
    for path in (chat, chat / "manifest.json", tmp_path / "architecture.json"):
        assert read_model_config(path) == expected
    assert read_model_config(hf) == read_model_config(hf / "config.json") == hf_model(LLAMA_3_8B, str)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({**LLAMA_3_8B, "num_key_value_heads": 5}, "config.json:num_key_value_heads"),
        ({**LLAMA_3_8B, "hidden_size": 0}, "config.json:hidden_size"),
        ({**LLAMA_3_8B, "intermediate_size": "big"}, "config.json:intermediate_size"),
        ({**LLAMA_3_8B, "torch_dtype": "int4"}, "config.json:torch_dtype"),
        ({**LLAMA_3_8B, "model_type": "gemma"}, "config.json:model_type"),
        ({**LLAMA_3_8B, "attention_bias": True}, "config.json:attention_bias"),
        ({**MISTRAL, "sliding_window": 0}, "config.json:sliding_window"),
        ({**QWEN2, "use_sliding_window": True}, "config.json:use_sliding_window"),
        ({**GPT2_SMALL, "n_head": 7}, "config.json:n_head"),
        ({k: v for k, v in GPT2_SMALL.items() if k != "n_layer"}, "config.json:n_layer"),
    ],
)
def test_a_config_the_model_cannot_count_is_refused_naming_its_field(tmp_path, config, field):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ApiError) as refused:
        read_model_config(tmp_path / "config.json")
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("architecture", "field"),
    [
        ({**GROUPED_LLAMA, "kv_heads": 3}, "a.json:kv_heads"),
        ({**GPT, "kv_heads": 2}, "a.json:kv_heads"),  # a GPT has no grouped heads
        ({**GPT, "activation": "swiglu"}, "a.json:activation"),
        ({**GPT, "heads": 5}, "a.json:heads"),
        ({**GPT, "precision": "float16"}, "a.json:precision"),
        ({**GPT, "position": "alibi"}, "a.json:position"),
        ({**GROUPED_LLAMA, "sliding_window": -1}, "a.json:sliding_window"),
        ({**GPT, "sliding_window": 16}, "a.json:sliding_window"),  # a GPT has no window
        ({**GPT, "rope_theta": 10000.0}, "a.json:rope_theta"),
    ],
)
def test_a_jgpt_architecture_is_checked_as_jgpt_checks_it(tmp_path, architecture, field):
    """As jgpt.model.architecture's readers refuse it, or where the analytic model cannot count it."""
    (tmp_path / "a.json").write_text(json.dumps(architecture))
    with pytest.raises(ApiError) as refused:
        read_model_config(tmp_path / "a.json")
    assert refused.value.field == field


@given(
    name=st.sampled_from(sorted(LLAMA_3_8B)),
    value=st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False) | st.text(max_size=8),
)
def test_any_value_of_any_field_gives_a_model_or_an_error_naming_a_field(name, value):
    try:
        model = hf_model({**LLAMA_3_8B, name: value}, lambda member: f"config.json:{member}")
    except ApiError as error:
        assert error.field.startswith("config.json:"), error
    else:
        assert model.kv_bytes_per_position > 0 and model.parameters > 0


@given(
    window=st.integers(1, 40),
    context=st.integers(1, 48),
    prompt=st.integers(1, 30),
    output=st.integers(1, 12),
    reused=st.integers(0, 29),
)
def test_a_sliding_window_bounds_the_keys_each_position_counts(window, context, prompt, output, reused):
    """Every prefill position, prefix and decode step against the sum of min(p + 1, W) keys, position by position
    (a window that holds the whole context bounds nothing)."""
    model = jgpt_model({**GROUPED_LLAMA, "context": context, "sliding_window": window}, str)
    seen = [p + 1 if window >= context else min(p + 1, window) for p in range(prompt + output)]
    flops = [model.dense_flops_per_position + model.attention_flops_per_key * keys for keys in seen]
    memory = [model.row_bytes_per_position + model.kv_bytes_per_position * keys for keys in seen]
    item = Conversation("r", 0, tuple(range(prompt)), tuple(range(output)), output, False)
    (request,) = analytic_computations(model, [item], "window").requests
    document = request_json(request)
    assert document["prefill_costs"]["position_matmul_flops"] == flops[:prompt]
    assert document["prefill_costs"]["position_memory_bytes"] == memory[:prompt]
    steps = document["decode_steps"]
    assert [s["matmul_flops"] for s in steps] == flops[prompt : prompt + output - 1]
    assert [s["logical_memory_bytes"] for s in steps] == [model.fixed_memory_bytes + m for m in memory[prompt:-1]]
    r = min(reused, prompt)
    assert request.prefill_cost(r) == (sum(flops[r:prompt]), model.fixed_memory_bytes + sum(memory[r:prompt]))
    assert model.prefill(prompt) == request.prefill_cost(0)


def test_a_llama_without_kv_heads_has_one_per_head_and_a_model_names_its_conventions():
    assert jgpt_model({**GROUPED_LLAMA, "kv_heads": None}, str).kv_width == GROUPED_LLAMA["width"]
    for conventions, field in (({"biases": "some"}, "biases"), ({"positions": "alibi"}, "positions")):
        with pytest.raises(ApiError) as refused:
            AnalyticModel(layers=1, width=8, ffn=8, vocabulary=8, precision_bytes=4, **conventions)
        assert refused.value.field == field


def test_mistrals_window_is_read_and_llamas_has_none():
    windowed = hf_model({**MISTRAL, "sliding_window": 4096, "max_position_embeddings": 32768}, str)
    assert windowed.attention_window == 4096
    assert windowed.decode_flops(10_000) == windowed.decode_flops(4095) > windowed.decode_flops(4094)
    assert hf_model(MISTRAL, str).attention_window is None
    assert hf_model({**LLAMA_3_8B, "sliding_window": 16}, str).attention_window is None  # transformers' llama: none


# -- the worked numbers docs/kvsim.md gives ----------------------------------------------------------------

WORKED = {"Llama-3-8B": LLAMA_3_8B, "GPT-2 small": GPT2_SMALL}
DECODE_POSITION = 1023  # the position the doc's decode step is at: the 1,024th token


def worked_numbers(model: AnalyticModel) -> dict[str, int]:
    """The doc table's rows (its names), computed by the code."""
    return {
        "parameters": model.parameters,
        "KV bytes per token": model.kv_bytes_per_position,
        "weight bytes held": model.weight_bytes,
        "weight bytes a work reads": model.fixed_memory_bytes,
        f"FLOPs of a decode step at position {DECODE_POSITION}": model.decode_flops(DECODE_POSITION),
        f"bytes of a decode step at position {DECODE_POSITION}": model.decode_bytes(DECODE_POSITION),
    }


def human(row: str, value: int) -> str:
    """How the doc writes `value` for reading: jgpt.foundation.units', FLOPs as a count of FLOP."""
    return units.byte_size(value) if "bytes" in row else units.count(value) + ("FLOP" if "FLOPs" in row else "")


def doc_table() -> dict[str, dict[str, int]]:
    """docs/kvsim.md's worked-numbers table, each model's column by row name; each cell is the exact integer
    and, in parentheses, the same for reading."""
    text = (ROOT / "docs" / "kvsim.md").read_text()
    section = text.split("<!-- worked analytic numbers -->\n")[1]
    lines = list(itertools.takewhile(lambda line: line.startswith("|"), section.splitlines()))
    models = [cell.strip() for cell in lines[0].strip("|").split("|")[1:]]
    table: dict[str, dict[str, int]] = {m: {} for m in models}
    for line in lines[2:]:
        row, *cells = [cell.strip() for cell in line.strip("|").split("|")]
        for m, cell in zip(models, cells, strict=True):
            exact, reading = re.fullmatch(r"([\d,]+) \((.+)\)", cell).groups()
            table[m][row] = int(exact.replace(",", ""))
            assert reading == human(row, table[m][row]), (m, row, cell)
    return table


def test_the_docs_worked_numbers_are_the_codes():
    assert doc_table() == {name: worked_numbers(hf_model(config, str)) for name, config in WORKED.items()}


def test_the_worked_numbers_follow_the_docs_formulas():
    """Llama-3-8B by the formulas docs/kvsim.md states, not by the code's tensor list."""
    L, w, q, k, f, V, p = 32, 4096, 32 * 128, 8 * 128, 14336, 128256, DECODE_POSITION
    matrices = L * (w * q + 2 * w * k + q * w + 3 * w * f) + w * V
    vectors = (2 * L + 1) * w
    assert worked_numbers(hf_model(LLAMA_3_8B, str)) == {
        "parameters": matrices + vectors + V * w,
        "KV bytes per token": 2 * L * k * 2,
        "weight bytes held": 2 * matrices + 4 * (vectors + V * w),
        "weight bytes a work reads": 2 * matrices + 4 * vectors,
        f"FLOPs of a decode step at position {p}": 2 * matrices + L * 4 * q * (p + 1),
        f"bytes of a decode step at position {p}": 2 * matrices + 4 * vectors + 4 * (w + V) + 2 * L * k * 2 * (p + 1),
    }


# -- --model-config on the commands -----------------------------------------------------------------------


def _kvsim(argv: list) -> int:
    from jgpt.cli.main import main as jgpt

    return jgpt(["kvsim", *map(str, argv)])


def test_synthesize_and_import_trace_count_the_model_config_names(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_8B))
    model = hf_model(LLAMA_3_8B, str)
    trace = ROOT / "tests" / "data" / "kvsim_mooncake_sample.jsonl"
    for argv in (["synthesize", "--requests", 6], ["import-trace", trace, "--format", "mooncake", "--block-tokens", 4]):
        out = tmp_path / "doc.json"
        assert _kvsim([*argv, "--model-config", tmp_path, "--out", out]) == 0
        document = json.loads(out.read_text())
        assert document["kv_bytes_per_position"] == model.kv_bytes_per_position == 131072
        assert document["model"]["architecture"] == model.architecture()
        request = document["requests"][0]
        assert request["prefill_costs"]["fixed_memory_bytes"] == model.fixed_memory_bytes
        assert request["prefill_costs"]["position_matmul_flops"][:3] == [model.position_flops(p) for p in range(3)]


@pytest.mark.parametrize(
    ("extra", "config", "field"),
    [
        (["--layers", "2"], LLAMA_3_8B, "--layers"),  # a size beside --model-config: refused, not ignored
        ([], {**LLAMA_3_8B, "num_key_value_heads": 3}, "config.json:num_key_value_heads"),
        ([], {**LLAMA_3_8B, "max_position_embeddings": 2**20, "num_hidden_layers": 2**10}, "analytic model"),
    ],
)
def test_a_model_config_the_commands_cannot_use_is_refused_naming_why(tmp_path, capsys, extra, config, field):
    (tmp_path / "config.json").write_text(json.dumps(config))
    argv = ["synthesize", "--requests", 2, "--model-config", tmp_path / "config.json", *extra, "--out", tmp_path / "d"]
    assert _kvsim(argv) != 0
    error = capsys.readouterr().err
    assert f"error: {field}: " in error, error
    assert not (tmp_path / "d").exists()


def test_block_tokens_are_bounded_by_the_model_configs_context(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({**GPT2_SMALL, "n_positions": 8}))
    trace = ROOT / "tests" / "data" / "kvsim_mooncake_sample.jsonl"
    argv = ["import-trace", trace, "--format", "mooncake", "--model-config", tmp_path, "--out", tmp_path / "d.json"]
    assert _kvsim(argv) != 0
    assert "error: --block-tokens: must be in [1, the context 8], got 512" in capsys.readouterr().err
