"""Stand-ins for the Forge recipes (subscribers only), made of what AWS publishes:

- training: the BYOO recipe exactly as the Nova 2 user guide prints it (tests/data/
  nova_byoo_recipe.yaml; nova-hp-rft-forge, "BYOO recipe configuration"); the LoRA one adds the
  `peft` section of AWS's public RFT LoRA recipe (aws/sagemaker-hyperpod-recipes 2631995,
  recipes_collection/recipes/fine-tuning/nova/nova_2_0/nova_lite/RFT/
  nova_lite_2_0_p5_gpu_lora_rft.yaml, `training_config.trainer.peft`) to its `train` section;
- evaluation: AWS's public Nova 2 RFT evaluation recipe (the same commit, recipes_collection/
  recipes/evaluation/nova/nova_2_0/nova_lite/nova_lite_2_0_p5_48xl_gpu_rft_eval.yaml) with or
  without the BYOO leaves the Forge SDK sets on it where the recipe has them (util/recipe.py
  `load_recipe_templates`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from training_configs.schema import Recipe

DOCUMENTED_BYOO_RECIPE = Path(__file__).parent / "data" / "nova_byoo_recipe.yaml"
PUBLIC_LORA_PEFT = {
    "peft_scheme": "lora",
    "lora_tuning": {"alpha": 32, "loraplus_lr_ratio": 64.0},
}


def documented_byoo_recipe() -> dict[str, Any]:
    return yaml.safe_load(DOCUMENTED_BYOO_RECIPE.read_text(encoding="utf-8"))


def forge_recipe(recipe: Recipe = "RFT_MULTITURN_LORA") -> dict[str, Any]:
    built = documented_byoo_recipe()
    if recipe == "RFT_MULTITURN_LORA":
        built["training_config"]["train"]["peft"] = PUBLIC_LORA_PEFT
    return built


def forge_evaluation_recipe(*, byoo: bool = True) -> dict[str, Any]:
    endpoints = ("rollout_request_arn", "rollout_response_sqs_url", "rollout_request_queue_url",
                 "generate_request_sqs_url", "generate_response_sqs_url")  # fmt: skip
    return {
        "run": {
            "name": "nova-lite-v2-rft-eval-job", "model_type": "amazon.nova-2-lite-v1:0:256k",
            "model_name_or_path": "nova-lite-2/prod", "replicas": 1, "data_s3_path": "",
            "output_s3_path": "", "mlflow_tracking_uri": "", "mlflow_experiment_name": "",
            "mlflow_run_name": "",
        },
        "evaluation": {"task": "rft_eval", "strategy": "rft_eval", "metric": "all"},
        "inference": {"max_new_tokens": 32768, "top_k": -1, "top_p": 1.0, "temperature": 0,
                      "top_logprobs": 0, "reasoning_effort": None},
        "rl_env": {"reward_lambda_arn": "arn:aws:lambda:<region>:<account_id>:function:<name>"}
        | ({key: "" for key in endpoints} if byoo else {}),
    }  # fmt: skip
