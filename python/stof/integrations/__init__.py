"""Integrations of stof with other libraries (each imported on its own:
stof.integrations.transformers needs Hugging Face transformers)."""
