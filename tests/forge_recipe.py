"""A stand-in for the Forge BYOO recipe (subscribers only): every leaf a run's overrides set,
with the Nova user guide's BYOO values (nova-hp-rft-forge, "BYOO recipe configuration"; AWS's
own pipeline, sample-nova-multi-turn-rl-infra), in the layout AWS's launcher requires of an RFT
recipe — `training_config` with `data`, `rollout` and `trainer` (aws/sagemaker-hyperpod-recipes
0700d22, the HyperPod CLI's pin, launcher/nova/launchers.py `SMNovaK8SLauncherRFT.
_validate_recipe_parameters`) — and the public RFT recipes put the trainer's keys
(nova_lite_2_0_p5_gpu_lora_rft.yaml: `trainer.optim_config.lr`, `trainer.peft.lora_tuning`)."""

from __future__ import annotations

from typing import Any


def forge_recipe() -> dict[str, Any]:
    run_keys = ("name", "model_name_or_path", "data_s3_path", "output_s3_path",
                "rollout_request_arn", "rollout_response_sqs_url", "rollout_request_queue_url",
                "generate_request_sqs_url", "generate_response_sqs_url")  # fmt: skip
    return {
        "run": {key: "" for key in run_keys}
        | {"model_type": "amazon.nova-2-lite-v1:0:256k", "replicas": 4, "generation_replicas": 2},
        "training_config": {
            "max_length": 8192, "global_batch_size": 256,
            "data": {"shuffle": False},
            "rollout": {"delegate": True, "timeout": 600,
                        "advantage_strategy": {"number_generation": 16},
                        "generator": {"max_new_tokens": 100, "timeout": 1000}},
            "trainer": {"max_steps": 100, "clip_ratio_high": 0.2, "optim_config": {"lr": 1e-7},
                        "peft": {"peft_scheme": "lora", "lora_tuning": {"alpha": 64}}},
        },
    }  # fmt: skip


def forge_evaluation_recipe() -> dict[str, Any]:
    """A stand-in for the Forge RFT multi-turn evaluation recipe (subscribers only): AWS's
    public Nova 2 RFT evaluation recipe (aws/sagemaker-hyperpod-recipes 2631995,
    recipes_collection/recipes/evaluation/nova/nova_2_0/nova_lite/
    nova_lite_2_0_p5_48xl_gpu_rft_eval.yaml) with the BYOO leaves the Forge SDK sets on it
    where the recipe has them (util/recipe.py `load_recipe_templates`)."""
    byoo = ("rollout_request_arn", "rollout_response_sqs_url", "rollout_request_queue_url",
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
        | {key: "" for key in byoo},
    }  # fmt: skip
