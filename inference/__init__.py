"""inference: jitted prefill and decode over an immutable KVState, greedy generation, and evidence.

Importing the package is cheap; the modules import jax.
"""
