"""Tokenizers: jgpt's byte-level BPE, Hugging Face tokenizer files as they are, the Encoding they
produce, and chat templates rendered in a bounded child process. Jax-free, so kvsim may read the
framing ids of a conversation from here."""
