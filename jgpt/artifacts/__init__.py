"""Models on disk: the ModelArtifact (weights, tokenizer, identities), the catalog of shipped and added
artifacts, and Hugging Face import and export."""
