"""The open-weights training plane: a GRPO trainer for any Hugging Face chat model that speaks
the rollout protocol v0 (generation service, rollout driver, token-exact trajectories, PyTorch
update, checkpoints). Runs on HyperPod in its own image and on a CPU in local mode."""
