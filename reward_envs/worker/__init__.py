"""The reward worker: pulls rollout requests, plays episodes against the model, reports rewards."""
