"""Experiments: ontology-bound labs that run the whole flow (model -> recorded computations -> kvsim -> record).

Importing this package stays cheap (no jax); running a lab imports inference lazily.
"""
