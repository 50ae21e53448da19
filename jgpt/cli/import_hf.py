"""`jgpt import-hf`: convert a local Hugging Face GPT-2 or Llama-family directory into a jgpt artifact."""

from __future__ import annotations

import argparse
from pathlib import Path

EXAMPLES = """\
example:
  jgpt import-hf ~/models/tiny-gpt2 --out checkpoints/tiny-gpt2
      reads config.json + model.safetensors (+ tokenizer.json with its tokenizer_config.json
      if present); downloads nothing, runs no remote code. Sizes and shapes are checked before
      any tensor is loaded. The model keeps its own tokenizer (GPT-2 byte-level or Llama
      byte-fallback BPE) as is; tokenizer_config.json must name its eos_token, the stop id.
      Llama, Mistral (sliding window) and Qwen2 (query/key/value biases) are read, with
      Llama 3.1's rope_scaling; what jgpt does not compute is refused naming the setting.
"""


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Convert a GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM saved "
        "with save_pretrained into a jgpt ModelArtifact with verified identities.",
    )
    p.add_argument("directory", type=Path, metavar="DIR", help="holds config.json and model.safetensors")
    p.add_argument("--out", type=Path, required=True, metavar="ARTIFACT_DIR", help="artifact directory to create")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a jgpt artifact at --out (never another directory, a file, or DIR itself)",
    )
    return p


def main(command: str, argv: list[str]) -> int:
    args = parser(f"jgpt {command}").parse_args(argv)
    from jgpt.artifacts.hf_import import import_hf

    artifact = import_hf(args.directory, args.out, overwrite=args.overwrite)
    a = artifact.architecture
    print(
        f"{artifact.path}: {type(a).__name__} L{a.layers} C{a.width} H{a.heads} V{a.vocabulary}, "
        f"{artifact.parameters:,} parameters"
    )
    print(f"checkpoint_sha256 {artifact.checkpoint_sha256}")
    print(f"tokenizer_sha256  {artifact.tokenizer_sha256}")
    print(f"manifest_sha256   {artifact.manifest_sha256}")
    return 0
