"""fincheck: train and evaluate compact LoRA-tuned hallucination detectors."""

__version__ = "0.1.0"
