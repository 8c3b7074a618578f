"""A stand-in for the Forge BYOO recipe (subscribers only): every leaf a run's overrides set,
where the Nova user guide's BYOO recipe (nova-hp-rft-forge, "BYOO recipe configuration") and
AWS's own pipeline (sample-nova-multi-turn-rl-infra) put them, with the guide's values."""

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
            "max_steps": 100, "global_batch_size": 256, "max_length": 8192,
            "rollout": {"delegate": True, "timeout": 600,
                        "advantage_strategy": {"number_generation": 16},
                        "generator": {"max_new_tokens": 100, "timeout": 1000}},
            "train": {"clip_ratio_high": 0.2, "optim": {"lr": 1e-7},
                      "peft": {"lora_tuning": {"alpha": 64}}},
        },
    }  # fmt: skip
