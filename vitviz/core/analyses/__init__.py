"""Analyses: what the captured attention says (maps, rollout, relevance, features, verify, compare, timeline)."""
