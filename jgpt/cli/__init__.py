"""The command-line faces: `main` is the umbrella `jgpt` command, which dispatches to every package's
commands; the other modules here are the faces of jgpt's own commands (tokenize, catalog, import-hf,
export-hf, schema, devices). Nothing imports a face but an entry point."""
