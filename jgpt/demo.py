"""`make demo`: the main job, end to end on a built-in sample.

For now it shows the Tokenizer: a multi-turn conversation framed into token ids,
with the spans that explain every id, first with the pure-byte vocabulary and then
with BPE merges learned from a small built-in corpus.
"""

from __future__ import annotations

import sys

from jgpt.commands.tokenize import render
from jgpt.tokenizer import Tokenizer, Turn

SAMPLE_CONVERSATION = (
    Turn("system", "Be concise."),
    Turn("user", "héllo 👋 what is 2+2?"),
    Turn("assistant", "4, très bien."),
)

# Enough repeated text for a few dozen merges, some of which cut a character in two.
SAMPLE_CORPUS = [
    "Be concise. What is 2+2? 2+2 is 4. What is 3+3? 3+3 is 6.",
    "héllo, hello, hello there 👋 👋 — merci, très bien, en français s'il vous plaît.",
] * 20


def main() -> int:
    byte_tokenizer = Tokenizer.bytes_only()
    bpe_tokenizer = Tokenizer.train(SAMPLE_CORPUS, vocab_size=320)
    titled = (("pure bytes", byte_tokenizer), ("byte-level BPE trained on the sample corpus", bpe_tokenizer))
    for title, tokenizer in titled:
        print(f"== {title}: {tokenizer.vocab_size} entries, {tokenizer.merge_count} merges ==")
        print(render(tokenizer.encode_turns(SAMPLE_CONVERSATION), tokenizer))
        print()
    prompt = bpe_tokenizer.encode_turns(SAMPLE_CONVERSATION[:2], open_turn="assistant")
    print(f"== generation prompt (system and user turns, then an open assistant turn): {len(prompt.ids)} ids ==")
    print(" ".join(map(str, prompt.ids)))
    print(bpe_tokenizer.decode(prompt.ids).text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
