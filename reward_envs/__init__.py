"""Reward environments (Wordle by default, bring your own) and the reward worker."""
