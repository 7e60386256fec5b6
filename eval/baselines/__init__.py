"""The papers' systems as baselines (`fincheck eval --method`): see `methods` for the list."""
