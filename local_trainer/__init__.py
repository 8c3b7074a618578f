"""The local trainer: GRPO over the rollout protocol with a small CPU policy."""
