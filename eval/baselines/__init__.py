"""The papers' systems as baselines (`fincheck baseline --method`): see `methods` for the list."""
