"""`jgpt export-hf`: write a jgpt artifact as a Hugging Face directory transformers loads."""

from __future__ import annotations

import argparse
from pathlib import Path

EXAMPLES = """\
example:
  jgpt export-hf chat --out exports/chat
      writes config.json, generation_config.json, model.safetensors, tokenizer.json and
      tokenizer_config.json; AutoModelForCausalLM.from_pretrained("exports/chat") loads it, and
      its tokenizer's apply_chat_template(messages, add_generation_prompt=True) gives jgpt's ids.
      `jgpt import-hf exports/chat --out ART` gives back the same checkpoint_sha256.
"""


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Export a jgpt ModelArtifact as a Hugging Face model directory: GPT2LMHeadModel for the "
        "GPT baseline, LlamaForCausalLM for the Llama alternative (MistralForCausalLM with a sliding window, "
        "Qwen2ForCausalLM with query/key/value biases), with its tokenizer and, for jgpt's, a chat template.",
    )
    p.add_argument("model", metavar="ARTIFACT", help="catalog id or artifact directory")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="the Hugging Face directory to write")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace DIR when it is a previous export holding nothing else (never another directory, the "
        "current one or one holding it)",
    )
    return p


def main(command: str, argv: list[str]) -> int:
    args = parser(f"jgpt {command}").parse_args(argv)
    from jgpt.artifacts.hf_export import export_hf

    out = export_hf(args.model, args.out, force=args.force)
    print(f"{out}: config.json, model.safetensors and the tokenizer for transformers")
    return 0
