"""The domain at the bottom of the house: the rollout protocol's messages, the run model and
store, the data bucket's layout, the dataset schema, run queue naming, model presets and the
compute backends' ports. It imports nothing of ours but the training configs (training_configs/,
the config part of the core); everything else depends on it, never the other way round."""
