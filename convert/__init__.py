"""ieconv: offline converters from Hugging Face checkpoints to iekit artifacts."""
