"""The rollout requests a trainer sends (domain/trainer_job.py): every sample number of a run,
its steps' and its dynamic-sampling refills', is its own — a worker's response, a trajectory
and the generation service's kept turns are found by it."""

from __future__ import annotations

import numpy as np

from domain.dataset import DatasetRecord
from domain.protocol import record_id_of
from domain.trainer_job import TrainingJob, refill_requests, step_requests
from training_configs.schema import load_training_config


def test_no_two_requests_of_a_run_share_a_sample_id() -> None:
    base = load_training_config("rft_multiturn_full")
    config = base.model_validate(
        {**base.model_dump(), "group_size": 4, "global_batch_size": 12, "max_steps": 3,
         "grpo": {"refill_rounds": 2}}
    )  # fmt: skip
    job = TrainingJob(
        run_id="r", bucket="b", dataset_key="k", output_prefix="runs/r/", queues={},
        config=config,
    )  # fmt: skip
    records = [
        DatasetRecord.model_validate({"id": f"q{i}", "metadata": {"prompt": "p"}}) for i in range(5)
    ]
    seen: list[str] = []
    for step in (1, 2, 3):
        groups, requests = step_requests(job, records, step, np.random.default_rng(step))
        assert len(groups) == 3 and all(len(samples) == 4 for samples in groups.values())
        seen += [request.sample_id for request in requests]
        for round_ in (1, 2):
            rng = np.random.default_rng([step, round_])
            groups, requests = refill_requests(job, records, step, round_, 3, rng)
            assert all(key.startswith(f"r{round_}-") for key in groups)
            seen += [request.sample_id for request in requests]
    assert len(seen) == len(set(seen)) == 3 * (12 + 2 * 12)
    assert {record_id_of(sample) for sample in seen} <= {record.id for record in records}
