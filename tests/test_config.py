"""The deployment configuration: defaults from cdk.json, `-c` strings, and clear errors."""

from __future__ import annotations

import json

import pytest

from stacks.config import (
    CDK_JSON,
    DEFAULT_NOVA_GROUP,
    ConfigError,
    FsxLustre,
    PlatformConfig,
    deployment_context,
)
from tests.conftest import EXISTING_HYPERPOD, PINNED


def test_cdk_json_defaults_are_valid_and_all_keys_known() -> None:
    context = json.loads(CDK_JSON.read_text())["context"]
    config = PlatformConfig.from_context(context)
    ours = {key for key in context if ":" not in key}
    assert ours <= set(PlatformConfig.model_fields)
    assert config.name_prefix == context["name_prefix"]
    assert [group.count for group in config.hyperpod_instance_groups] == [0, 0]
    # Nova-ready: the restricted group the config adds (cdk.json names the GPU group only).
    assert config.nova_group == DEFAULT_NOVA_GROUP and config.nova_notice is None


def test_a_nova_ready_deployment_gets_awss_sized_restricted_group_where_nova_is_published() -> None:
    """AWS's own Nova multi-turn sample (aws-samples/sample-nova-multi-turn-rl-infra,
    stacks/nova_rl_stack.py) gives its restricted group FSx for Lustre of 9,600 GiB at
    250 MB/s/TiB; the launcher as deployed publishes Nova's images in us-east-1 only."""
    fsx = DEFAULT_NOVA_GROUP.fsx
    assert fsx is not None and (fsx.size_gib, fsx.per_unit_storage_throughput) == (9600, 250)
    assert (DEFAULT_NOVA_GROUP.count, DEFAULT_NOVA_GROUP.restricted) == (0, True)
    east = PlatformConfig.from_context(deployment_context({"region": "us-east-1"}))
    assert [g.name for g in east.hyperpod_instance_groups] == ["gpu", "nova"]
    west = PlatformConfig.from_context(deployment_context({"region": "eu-west-1"}))
    assert [g.name for g in west.hyperpod_instance_groups] == ["gpu"]
    assert west.nova_notice == (
        "no restricted instance group for Nova: AWS's launcher as deployed (recipes 0700d22) "
        "publishes Nova's RFT images in us-east-1 only, not eu-west-1; this deployment trains "
        "open-weights models (set nova_restricted_group: false to say so)"
    )
    off = PlatformConfig.from_context(deployment_context({"nova_restricted_group": "false"}))
    assert [g.name for g in off.hyperpod_instance_groups] == ["gpu"] and off.nova_notice is None
    quiet = deployment_context({"region": "eu-west-1", "nova_restricted_group": False})
    assert PlatformConfig.from_context(quiet).nova_notice is None
    # A restricted group of the user's own is kept as it is, and nothing is added beside it.
    own = PlatformConfig.from_context(deployment_context(PINNED))
    assert [(g.name, g.fsx) for g in own.hyperpod_instance_groups if g.restricted] == [
        ("nova", FsxLustre(size_gib=2400, per_unit_storage_throughput=250))
    ]
    # An existing HyperPod cluster is its owner's: nothing is added to the groups it lists.
    existing = PlatformConfig.from_context(
        deployment_context({**EXISTING_HYPERPOD, "region": "us-east-1"})
    )
    assert not existing.nova_group and existing.nova_notice is None
    # Read back from its own dump (mtrl config --json), it is the same deployment.
    assert PlatformConfig.model_validate(east.model_dump()) == east


def test_cli_strings_are_parsed_like_cdk_json_values() -> None:
    config = PlatformConfig.from_context(
        {
            "region": "eu-west-1",
            "az_count": "3",
            "install_training_operator": "false",
            "hyperpod_instance_groups": '[{"name": "gen", "instance_type": "ml.g5.12xlarge",'
            ' "count": "2", "threads_per_core": 2}]',
        }
    )
    assert config.az_count == 3
    assert config.install_training_operator is False
    group = config.hyperpod_instance_groups[0]
    assert (group.name, group.instance_type, group.count, group.threads_per_core) == (
        "gen",
        "ml.g5.12xlarge",
        2,
        2,
    )


def test_cdk_own_context_keys_are_ignored() -> None:
    config = PlatformConfig.from_context(
        {"@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy": True, "aws:cdk:bundling-stacks": []}
    )
    assert config == PlatformConfig()


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({"az_count": "9"}, ["'az_count'", '"9"', "less than or equal to 6"]),
        ({"vpc_cidr": "10.0.0.0/8"}, ["'vpc_cidr'", "10.0.0.0/8", "/16 and /20"]),
        ({"vpc_cidr": "10.0.0.300/16"}, ["'vpc_cidr'", "IPv4 CIDR"]),
        ({"eks_version": "1.20"}, ["'eks_version'", "1.20", "1.33"]),
        ({"name_prefix": "Nova_MTRL"}, ["'name_prefix'", "Nova_MTRL", "must match"]),
        ({"region": "useast"}, ["'region'", "useast", "us-east-1"]),
        (
            {
                "hyperpod_instance_groups": '[{"name":"gpu","instance_type":"p5.48xlarge","count":1}]'
            },
            ["'hyperpod_instance_groups[0].instance_type'", "p5.48xlarge", "ml.p5.48xlarge"],
        ),
        (
            {
                "hyperpod_instance_groups": '[{"name":"gpu","instance_type":"ml.p5.48xlarge","count":-1}]'
            },
            ["'hyperpod_instance_groups[0].count'", "-1", "greater than or equal to 0"],
        ),
        (
            {
                "hyperpod_instance_groups": '[{"name":"gpu","instance_type":"ml.p5.48xlarge",'
                '"count":1,"threads_per_core":4}]'
            },
            ["'hyperpod_instance_groups[0].threads_per_core'", "4", "1 or 2"],
        ),
        (
            {
                "hyperpod_instance_groups": '[{"name":"a","instance_type":"ml.p5.48xlarge","count":1},'
                '{"name":"a","instance_type":"ml.p5.48xlarge","count":1}]'
            },
            ["'hyperpod_instance_groups'", "unique", "'a'"],
        ),
        (
            {
                "hyperpod_instance_groups": '[{"name":"nova","instance_type":"ml.p5.48xlarge",'
                '"count":0,"restricted":true}]'
            },
            [
                "'hyperpod_instance_groups[0]'",
                "restricted group 'nova' needs fsx: {size_gib "
                "(1200-100800), per_unit_storage_throughput (125, 250, 500 or 1000)}, its "
                "service-managed FSx",
            ],
        ),
        (
            {
                "hyperpod_instance_groups": '[{"name":"gpu","instance_type":"ml.p5.48xlarge",'
                '"count":0,"fsx":{"size_gib":1200,"per_unit_storage_throughput":250}}]'
            },
            ["'hyperpod_instance_groups[0]'", "group 'gpu' has fsx but is not restricted"],
        ),
        (
            {
                "hyperpod_instance_groups": '[{"name":"nova","instance_type":"ml.p5.48xlarge",'
                '"count":0,"restricted":true,"fsx":{"size_gib":1000,'
                '"per_unit_storage_throughput":250}}]'
            },
            ["'hyperpod_instance_groups[0].fsx.size_gib'", "1000", "greater than or equal to 1200"],
        ),
        (
            {
                "hyperpod_instance_groups": '[{"name":"nova","instance_type":"ml.p5.48xlarge",'
                '"count":0,"restricted":true,"fsx":{"size_gib":1200,'
                '"per_unit_storage_throughput":250}},{"name":"gpu","instance_type":'
                '"ml.p5.48xlarge","count":0}]'
            },
            [
                "'training_instance_group'",
                'value "nova"',
                "names a restricted group, which runs Nova's "
                "images only, not this pipeline's training job; name a standard group (gpu)",
            ],
        ),
        (
            {
                "region": "eu-west-1",
                "hyperpod_instance_groups": '[{"name":"gpu","instance_type":"ml.p5.48xlarge",'
                '"count":0},{"name":"nova","instance_type":"ml.p5.48xlarge","count":0,'
                '"restricted":true,"fsx":{"size_gib":1200,"per_unit_storage_throughput":250}}]',
            },
            [
                "'hyperpod_instance_groups'",
                "is a restricted (Nova) group, and region eu-west-1 has no Nova RFT images in "
                "AWS's launcher as deployed (recipes 0700d22); deploy to one of us-east-1",
            ],
        ),
        (
            {
                "model_presets": '{"nova-lite-2":{"model_id":"nova-lite-2/prod","trainer_image":"i"}}'
            },
            [
                "'model_presets'",
                "is a Nova model: Nova trains on a restricted instance group with AWS's launcher "
                "and Forge recipe, not a preset; remove it and add a group with restricted: true",
            ],
        ),
        ({"hyperpod_instance_groups": "[oops"}, ["'hyperpod_instance_groups'", "not valid JSON"]),
        ({"hyperpod_instance_groups": "[]"}, ["'hyperpod_instance_groups'", "at least 1"]),
        ({"reward_worker_cpu": "1000"}, ["'reward_worker_cpu'", "1000", "1024"]),
        (
            {"reward_worker_cpu": "1024", "reward_worker_memory_mib": "512"},
            ["'reward_worker_memory_mib'", "512", "2048 and 8192"],
        ),
        (
            {"system_node_group": '{"min_size": 3, "desired_size": 1}'},
            ["'system_node_group'", "min_size <= desired_size <= max_size"],
        ),
        ({"alert_email": "ops-at-example"}, ["'alert_email'", "ops-at-example", "e-mail"]),
        ({"eks_admin_role_arns": '["admin"]'}, ["'eks_admin_role_arns[0]'", "admin"]),
        (
            {"region": "us-east-1", "availability_zones": '["eu-west-1a", "eu-west-1b"]'},
            ["'availability_zones'", "us-east-1"],
        ),
        (
            {"existing_eks_cluster": '{"cluster_name": "eks", "security_group_id": "sg-12345678"}'},
            ["'existing_eks_cluster'", "existing_vpc"],
        ),
        (
            {"existing_hyperpod_cluster": '{"cluster_name": "hp"}'},
            ["'existing_hyperpod_cluster'", "existing_eks_cluster"],
        ),
        (
            {
                "existing_vpc": '{"vpc_id": "vpc-12345678", "availability_zones": ["us-east-1a",'
                ' "us-east-1b"], "private_subnet_ids": ["subnet-12345678"]}'
            },
            ["'existing_vpc'", "one subnet per availability zone"],
        ),
        (
            {
                "model_presets": '{"llama":{"model_id":"meta-llama/Llama-3.1-8B","hub_token_secret":'
                '"hf token"}}'
            },
            ["'model_presets.llama.hub_token_secret'", "hf token", "[A-Za-z0-9/_+=.@-]"],
        ),  # fmt: skip
        ({"vpc_cdir": "10.1.0.0/16"}, ["'vpc_cdir'", "did you mean 'vpc_cidr'"]),
        (
            {"system_node_group": '{"instance_type": "m6i.large", "min": 1}'},
            ["'system_node_group.min'", "not known"],
        ),
    ],
)
def test_invalid_values_name_key_value_and_what_is_allowed(
    context: dict[str, str], expected: list[str]
) -> None:
    with pytest.raises(ConfigError) as raised:
        PlatformConfig.from_context(context)
    message = str(raised.value)
    assert "\n" not in message
    for fragment in expected:
        assert fragment in message, f"{fragment!r} missing from: {message}"


def test_zones_are_given_or_left_to_cloudformation() -> None:
    assert PlatformConfig().zones is None
    assert PlatformConfig(region="eu-west-1", az_count=3).zones is None
    given = PlatformConfig(
        region="us-east-1", availability_zones=["us-east-1d", "us-east-1f"], az_count=2
    )
    assert given.zones == ["us-east-1d", "us-east-1f"]


def test_deployment_context_prefers_what_the_cdk_cli_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CDK_CONTEXT_JSON", json.dumps({"name_prefix": "from-cli"}))
    assert deployment_context()["name_prefix"] == "from-cli"
    assert deployment_context({"name_prefix": "override"})["name_prefix"] == "override"
    monkeypatch.delenv("CDK_CONTEXT_JSON")
    assert (
        deployment_context()["name_prefix"]
        == json.loads(CDK_JSON.read_text())["context"]["name_prefix"]
    )
