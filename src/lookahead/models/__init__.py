"""Loading a model: bundled names, Hugging Face ids, local folders and ``.gguf`` files."""
