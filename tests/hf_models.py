"""Hugging Face model directories made locally for the import/export tests: a tokenizer trained
with `tokenizers` (GPT-2's byte-level BPE, or Llama's byte-fallback BPE with a BOS post-processor)
saved by transformers next to a random, perturbed model of the matching family: GPT-2 and Qwen2
(biases on query, key and value; tied head) with the byte-level one, Llama and Mistral (a sliding
window of 8, which a prompt and 16 generated tokens pass) with the byte-fallback one. Tiny sizes."""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
import torch
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

CORPUS = [
    "some text about the cat and the dog, and some more text",
    "Héllo wörld 👋 naïve café, größe",
    "the quick brown fox jumps over the lazy dog",
    "日本語のテキスト",
] * 8


def gpt2_tokenizer() -> tokenizers.Tokenizer:
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tokenizer


def llama_tokenizer() -> tokenizers.Tokenizer:
    """Llama 2's layout: <unk> <s> </s>, the 256 byte-fallback pieces <0xNN>, then learned pieces;
    a space is "▁" (prepended to the text too) and the post-processor adds <s>."""
    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = ["<unk>", "<s>", "</s>"]
    tokenizer.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300 + 256, special_tokens=specials + [f"<0x{b:02X}>" for b in range(256)], show_progress=False
        ),
    )
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    spec = json.loads(tokenizer.to_str())
    spec["added_tokens"] = spec["added_tokens"][:3]  # the byte pieces are vocabulary, not added tokens
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


LLAMA_SIZES = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def save_model(family: str, directory: Path):
    """Save tokenizer and perturbed random model under `directory`; return (torch model, transformers tokenizer)."""
    torch.manual_seed(0)
    if family in ("gpt2", "qwen2"):
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=gpt2_tokenizer(), eos_token="<|endoftext|>", bos_token="<|endoftext|>"
        )
        eos = tokenizer.eos_token_id
        if family == "gpt2":
            model = GPT2LMHeadModel(
                GPT2Config(
                    vocab_size=len(tokenizer),
                    n_embd=32,
                    n_layer=2,
                    n_head=4,
                    n_positions=64,
                    bos_token_id=eos,
                    eos_token_id=eos,
                )
            )
        else:
            model = Qwen2ForCausalLM(Qwen2Config(**LLAMA_SIZES, vocab_size=len(tokenizer), tie_word_embeddings=True,
                                                 bos_token_id=eos, eos_token_id=eos))  # fmt: skip
    else:
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=llama_tokenizer(), eos_token="</s>", bos_token="<s>", unk_token="<unk>"
        )
        ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
        if family == "llama":
            model = LlamaForCausalLM(LlamaConfig(**LLAMA_SIZES, vocab_size=len(tokenizer), **ids))
        else:
            model = MistralForCausalLM(MistralConfig(**LLAMA_SIZES, vocab_size=len(tokenizer), sliding_window=8, **ids))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))  # over the 0.02 init: varied greedy ids
    model.eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model, tokenizer
