"""Training configurations (RFT_MULTITURN_LORA, RFT_MULTITURN_FULL) and the cost model."""

from training_configs.costs import CostEstimate, InstancePrices, estimate
from training_configs.schema import TrainingConfig, TrainingConfigError, load_training_config

__all__ = [
    "CostEstimate",
    "InstancePrices",
    "TrainingConfig",
    "TrainingConfigError",
    "estimate",
    "load_training_config",
]
