"""Running a model: the one inference path (render, fit, generate), the prefix tree and prefix
reuse, the LLM clients of every endpoint."""
