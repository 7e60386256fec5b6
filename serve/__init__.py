"""Using and sharing a trained detector: `fincheck detect`, `fincheck merge`, `fincheck publish`."""
