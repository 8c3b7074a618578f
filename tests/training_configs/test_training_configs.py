"""Training configs: the shipped files, validation errors that name file and key, the cost model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from training_configs import InstancePrices, TrainingConfigError, estimate, load_training_config
from training_configs.schema import SHIPPED, parse_training_config


def _lora() -> dict:
    return yaml.safe_load(
        Path(__file__)
        .resolve()
        .parents[2]
        .joinpath("training_configs", "rft_multiturn_lora.yaml")
        .read_text()
    )


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_load_and_fit_their_budget(name: str) -> None:
    config = load_training_config(name)
    assert config.recipe == name.upper()
    assert config.global_batch_size % config.group_size == 0
    assert estimate(config).within_budget


def test_lora_and_full_differ_where_they_should() -> None:
    lora, full = (
        load_training_config("rft_multiturn_lora"),
        load_training_config("rft_multiturn_full"),
    )
    assert lora.lora is not None and full.lora is None
    assert full.instance_count > lora.instance_count


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"generation_replicas": 3}, "generation_replicas: Input should be 2, 4, 6 or 8"),
        ({"group_size": 8, "global_batch_size": 60}, "must be a multiple of group_size (8)"),
        (
            {"max_length": 512, "max_new_tokens": 1024},
            "max_length must be larger than max_new_tokens",
        ),
        ({"lora": None}, "RFT_MULTITURN_LORA needs a lora"),
        ({"recipe": "RFT_MULTITURN_FULL"}, "remove the lora section"),
        ({"recipe": "SFT"}, "recipe: Input should be 'RFT_MULTITURN_LORA' or 'RFT_MULTITURN_FULL'"),
        ({"learning_rate": 0.5}, "learning_rate: Input should be less than or equal to 0.01"),
        ({"instance_type": "p5.48xlarge"}, "instance_type: String should match pattern"),
        ({"budget_usd": 0}, "budget_usd: Input should be greater than 0"),
        ({"lerning_rate": 1e-5}, "lerning_rate: unknown key"),
        ({"lora": {"rank": 0}}, "lora.rank: Input should be greater than or equal to 1"),
        ({"eval_fraction": 1.0}, "eval_fraction: Input should be less than 1"),
        (
            {"eval_dataset": "training-data/held.jsonl"},
            "eval_dataset: String should match pattern '^evaluation-data/",
        ),
        (
            {"eval_dataset": "evaluation-data/held.jsonl", "eval_fraction": 0.2},
            "eval_dataset names the evaluation records; remove eval_fraction",
        ),
        ({"eval_samples": 0}, "eval_samples: Input should be greater than or equal to 1"),
        ({"base_checkpoint": "wordle-1"}, "base_checkpoint: String should match pattern"),
    ],
)
def test_errors_name_the_file_and_the_key(change: dict, expected: str) -> None:
    data = {**_lora(), **change}
    with pytest.raises(TrainingConfigError) as raised:
        parse_training_config(yaml.safe_dump(data), "my.yaml")
    message = str(raised.value)
    assert message.startswith("config my.yaml: ") and expected in message, message


def test_every_problem_is_listed_with_the_closest_key_for_a_misspelt_one() -> None:
    """A misspelt required key, a misspelt nested one and a bad value: all three, each named,
    the unknown keys with the key they were likely meant to be (at their level)."""
    data = {key: value for key, value in _lora().items() if key != "group_size"}
    data |= {"grop_size": 8, "learning_rate": 0.5, "lora": {**_lora()["lora"], "rnak": 8}}
    with pytest.raises(TrainingConfigError) as raised:
        parse_training_config(yaml.safe_dump(data), "my.yaml")
    problems = str(raised.value).removeprefix("config my.yaml: ").split("; ")
    assert sorted(problems) == sorted(
        [
            "group_size: Field required",
            "grop_size: unknown key (did you mean group_size?)",
            "learning_rate: Input should be less than or equal to 0.01",
            "lora.rnak: unknown key (did you mean rank?)",
        ]
    )
    assert "lerning_rate: unknown key (did you mean learning_rate?)" in str(
        _refused({**_lora(), "lerning_rate": 1e-5})
    )
    assert "zzz: unknown key (check its spelling)" in str(_refused({**_lora(), "zzz": 1}))


def _refused(data: dict) -> TrainingConfigError:
    with pytest.raises(TrainingConfigError) as raised:
        parse_training_config(yaml.safe_dump(data), "my.yaml")
    return raised.value


def test_an_evaluation_file_replaces_the_held_out_share() -> None:
    held = parse_training_config(yaml.safe_dump(_lora()))
    assert (held.held_out_fraction, held.evaluates) == (0.1, True)
    named = held.model_validate({**_lora(), "eval_dataset": "evaluation-data/wordle.jsonl"})
    assert (named.held_out_fraction, named.evaluates) == (0.0, True)
    none = held.model_validate({**_lora(), "eval_fraction": 0.0})
    assert (none.held_out_fraction, none.evaluates) == (0.0, False)
    # The pipeline carries a config as JSON between its steps: it must read back the same.
    assert named.model_validate(named.model_dump(mode="json")) == named


LAUGHS = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]" for i in range(8)]
    + ["environment_args: {laughs: *i}"]
)


def test_a_config_that_expands_aliases_without_bound_is_refused_at_its_line(
    tmp_path: Path,
) -> None:
    """Nested aliases of ten make 10^9 values for the validator to walk (a "billion laughs"):
    refused at the line whose value passes the bound, before anything is built; so is an
    anchor inside itself."""
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text(yaml.safe_dump(_lora()) + LAUGHS + "\n")
    line = len(yaml.safe_dump(_lora()).splitlines()) + 5  # `e: &e [*d, …]`: 111111 values
    with pytest.raises(
        TrainingConfigError,
        match=rf"laughs.yaml: line {line}: its YAML aliases \(\*name\) expand to more than "
        r"100000 values: reuse fewer values$",
    ):
        load_training_config(laughs)
    looped = tmp_path / "looped.yaml"
    looped.write_text(yaml.safe_dump(_lora()) + "environment_args: &loop {again: *loop}\n")
    with pytest.raises(TrainingConfigError, match="expand to more than 100000 values"):
        load_training_config(looped)


def test_a_config_nested_past_the_bound_is_refused_at_its_line(tmp_path: Path) -> None:
    """PyYAML's composer recurses once per level: 5,000 levels ended in a RecursionError and a
    traceback; now the line where nesting passes 100 levels is named, in flow or block style."""
    head = yaml.safe_dump(_lora())
    lines = len(head.splitlines())
    flow = tmp_path / "flow.yaml"
    flow.write_text(head + "environment_args: {a: " + "[" * 5000 + "]" * 5000 + "}\n")
    block = tmp_path / "block.yaml"
    block.write_text(
        head + "environment_args:\n" + "".join(f"{'  ' * i}k{i}:\n" for i in range(1, 120))
    )
    for config, line in ((flow, lines + 1), (block, lines + 100)):
        with pytest.raises(
            TrainingConfigError,
            match=rf"^config {config}: line {line}: nested more than 100 levels deep: nest less "
            r"deeply$",
        ):
            load_training_config(config)
    # Within the bound: the document's own two levels and 97 of lists.
    fine = tmp_path / "fine.yaml"
    fine.write_text(head + "environment_args: {a: " + "[" * 97 + "]" * 97 + "}\n")
    value = load_training_config(fine).environment_args["a"]
    for _ in range(96):
        (value,) = value
    assert value == []
    reused = tmp_path / "reused.yaml"
    lora = {k: v for k, v in _lora().items() if k != "environment_args"}
    reused.write_text(
        yaml.safe_dump(lora) + "environment_args: &args {max_turns: 6}\nmetadata_note: *args\n"
    )
    with pytest.raises(TrainingConfigError, match="metadata_note: unknown key"):
        load_training_config(reused)  # a few aliases are read as YAML reads them


def test_files_and_yaml_errors(tmp_path: Path) -> None:
    with pytest.raises(
        TrainingConfigError, match="no such file; use a path or one of rft_multiturn_lora"
    ):
        load_training_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(TrainingConfigError, match=r"broken.yaml: not valid YAML at line 2"):
        load_training_config(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(TrainingConfigError, match="expected a mapping"):
        load_training_config(listed)
    own = tmp_path / "own.yaml"
    own.write_text(yaml.safe_dump({**_lora(), "name": "mine"}))
    assert load_training_config(own).name == "mine"


def test_cost_model_adds_gpus_workers_and_platform() -> None:
    prices = InstancePrices(
        hyperpod_instance_per_hour={"ml.p5.48xlarge": 100.0},
        fargate_vcpu_per_hour=0.04,
        fargate_gb_per_hour=0.005,
        platform_idle_per_hour=0.5,
        fsx_lustre_per_gb_month={250: 0.21},
    )
    config = parse_training_config(
        yaml.safe_dump(
            {
                **_lora(),
                "instance_count": 3,
                "reward_workers": 10,
                "deadline_hours": 2,
                "budget_usd": 600,
            }
        )
    )
    cost = estimate(config, prices, worker_vcpus=1, worker_memory_gb=2)
    assert cost.gpu_per_hour == 300.0
    assert cost.reward_workers_per_hour == pytest.approx(10 * (0.04 + 2 * 0.005))
    assert cost.per_hour == pytest.approx(300.0 + 0.5 + 0.5)
    assert cost.run_at_most == pytest.approx(602.0) and not cost.within_budget
    assert "OVER the $600 budget" in cost.describe()


def test_unknown_instance_price_says_how_to_fix() -> None:
    config = parse_training_config(yaml.safe_dump({**_lora(), "instance_type": "ml.trn2.48xlarge"}))
    with pytest.raises(
        KeyError, match="no price for ml.trn2.48xlarge; known: .*add it to your prices file"
    ):
        estimate(config)


def test_an_fsx_costs_by_its_size_and_throughput_tier_and_an_unknown_tier_is_named() -> None:
    prices = InstancePrices.load()
    per_gb_month = prices.fsx_lustre_per_gb_month[125]
    assert prices.fsx_lustre_per_hour(size_gib=1200, throughput=125) == pytest.approx(
        1200 * per_gb_month / 730
    )
    assert sorted(prices.fsx_lustre_per_gb_month) == [125, 250, 500, 1000]  # CreateCluster's tiers
    with pytest.raises(KeyError, match="no FSx for Lustre price at 300 MB/s/TiB; known: 125, 250"):
        prices.fsx_lustre_per_hour(size_gib=1200, throughput=300)
