"""The rollout router: per-run queues, conversation state, the proxy and the response consumer."""
