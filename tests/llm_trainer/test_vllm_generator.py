"""Generation with vLLM, driven with stand-ins for vLLM's offline API (no vLLM here): what the
generator asks the engine for — token-id prompts, one sampling request per prompt with the
sampled token's log-probability and its own seed, the adapter of the last update — and how it
reads the engine's completions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from llm_trainer.generation import Sampled, SamplingSettings
from llm_trainer.model import ModelNotLoaded
from llm_trainer.trainer import LlmTrainer, generation_kind
from llm_trainer.vllm_generator import VllmApi, VllmGenerator, handover_root
from tests.llm_trainer.fakes import EpisodeQueues
from tests.llm_trainer.test_trainer import BUCKET, job_for, share_of_e
from training_configs.schema import TrainingConfig, load_training_config


@dataclass(frozen=True)
class Logprob:  # vLLM's: one per token id at a position
    logprob: float


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]
    finish_reason: str


@dataclass
class Engine:
    """Answers each prompt with the next scripted completion; keeps what it was asked."""

    script: list[Completion]
    calls: list[dict[str, Any]] = field(default_factory=list)

    def generate(self, prompts: list[Any], params: list[Any], **options: Any) -> list[Any]:
        self.calls.append({"prompts": prompts, "params": params, **options})
        return [type("RequestOutput", (), {"outputs": [self.script.pop(0)]}) for _ in prompts]


API = VllmApi(
    sampling_params=lambda **settings: settings,
    tokens_prompt=lambda **prompt: prompt,
    lora_request=lambda name, number, path: (name, number, path),
)
STOP = 2


def _completions() -> list[Completion]:
    return [
        Completion([5, 6, STOP], [{5: Logprob(-0.5), 9: Logprob(-2.0)}, {6: Logprob(-0.25)},
                                  {STOP: Logprob(-0.125)}], "stop"),
        Completion([7, 8], [{7: Logprob(-1.0)}, {8: Logprob(-1.5), 3: Logprob(-0.1)}], "length"),
    ]  # fmt: skip


@pytest.fixture
def lora_model(tokenizer: Any, model: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))


def test_it_samples_each_prompt_with_its_seed_and_the_last_adapter(
    tmp_path: Path, lora_model: Any
) -> None:
    engine = Engine(_completions())
    generator = VllmGenerator(engine, API, adapters=tmp_path)
    with pytest.raises(RuntimeError, match="sync the policy first"):
        generator.generate([[1, 2]], SamplingSettings(4), seed=0)
    generator.sync(lora_model)
    sampled = generator.generate(
        [[1, 2, 3], [4]], SamplingSettings(2, temperature=0.7, top_p=0.9, top_k=20), seed=100
    )
    assert sampled == [
        Sampled([5, 6, STOP], [-0.5, -0.25, -0.125], "stop"),  # the sampled tokens' own
        Sampled([7, 8], [-1.0, -1.5], "length"),
    ]
    (call,) = engine.calls
    assert call["prompts"] == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4]}]
    sampling = {"max_tokens": 2, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "logprobs": 0,
                "detokenize": False}  # fmt: skip
    assert call["params"] == [{**sampling, "seed": 100}, {**sampling, "seed": 101}]
    assert call["lora_request"] == ("policy-v1", 1, str(tmp_path / "v1"))
    assert call["use_tqdm"] is False
    # The adapter as PEFT writes it, which vLLM loads.
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        path.name for path in (tmp_path / "v1").iterdir()
    }


def test_each_update_is_served_from_the_next_generate_on(tmp_path: Path, lora_model: Any) -> None:
    engine = Engine(_completions() * 3)
    generator = VllmGenerator(engine, API, adapters=tmp_path)
    served = []
    for _ in range(3):
        generator.sync(lora_model)
        generator.generate([[1]], SamplingSettings(2), seed=0)
        served.append(engine.calls[-1]["lora_request"][:2])
    assert served == [("policy-v1", 1), ("policy-v2", 2), ("policy-v3", 3)]
    # The adapter before last is gone; the last two stay (the last may still be loading).
    assert sorted(path.name for path in tmp_path.iterdir()) == ["v2", "v3"]


def test_vllm_serves_lora_runs_only() -> None:
    full = load_training_config("rft_multiturn_full").model_dump()
    with pytest.raises(ValueError, match="grpo.generation vllm serves a LoRA run's adapter"):
        TrainingConfig.model_validate({**full, "grpo": {"generation": "vllm"}})


def test_without_vllm_the_trainer_says_what_it_needs(aws: None, tmp_path: Path) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    job = job_for(
        recipe="RFT_MULTITURN_LORA", lora={"rank": 4, "alpha": 8},
        grpo={"generation": "vllm", "micro_batch_size": 8},
    )  # fmt: skip
    with pytest.raises(ModelNotLoaded, match="grpo.generation vllm needs vllm"):
        LlmTrainer(job, sqs=EpisodeQueues(share_of_e), s3=s3, workdir=tmp_path)


@pytest.mark.parametrize(
    ("lora", "gpu", "installed", "kind"),
    [
        (True, True, True, "vllm"),  # the trainer image on HyperPod, a LoRA run
        (True, True, False, "transformers"),
        (True, False, True, "transformers"),  # vLLM's engine needs the GPU
        (False, True, True, "transformers"),  # no weight push into vLLM for full fine-tuning
    ],
)
def test_auto_generation_is_vllm_where_it_can_serve_the_run(
    lora: bool, gpu: bool, installed: bool, kind: str
) -> None:
    assert generation_kind("auto", lora=lora, gpu=gpu, vllm_installed=installed) == kind
    assert generation_kind("transformers", lora=lora, gpu=gpu, vllm_installed=installed) == (
        "transformers"
    )


def test_the_adapter_goes_through_shared_memory_where_there_is_one(tmp_path: Path) -> None:
    """vLLM reads an adapter from a folder only: on a tmpfs (the pod's /dev/shm) that folder
    is memory; without one, the system's temporary folder."""
    assert handover_root(tmp_path) == str(tmp_path)
    assert handover_root(tmp_path / "absent") is None
