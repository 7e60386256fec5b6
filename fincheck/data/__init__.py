"""Instruction pairs and what makes them: the pair schema, seeded group splits, sentence splitting,
trimming to a token budget, prompts from files, the prepared folder."""
