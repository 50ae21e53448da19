"""The jax-free foundation: errors, validation, JSON input, identities, paths, units, progress, limits,
the ontology registry and the command-line parser every face builds on. It imports nothing from the
other rooms, and kvsim may depend on it (tests/test_architecture.py keeps it free of jax and numpy)."""
