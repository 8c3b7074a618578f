"""The network stack: subnets, NAT, flow logs, endpoints, pinned zones."""

from __future__ import annotations

import json

from tests.conftest import Synthesized

INTERFACE_SERVICES = {
    "ecr.api",
    "ecr.dkr",
    "eks",
    "eks-auth",
    "sts",
    "logs",
    "sqs",
    "lambda",
    "sagemaker.api",
}


def _service(endpoint: dict) -> str:
    """The endpoint's service name as text, e.g. `com.amazonaws.<region>.ecr.api`."""
    name = endpoint["Properties"]["ServiceName"]
    if isinstance(name, dict):
        separator, parts = name["Fn::Join"]
        name = separator.join(part if isinstance(part, str) else "<region>" for part in parts)
    return name


def test_vpc_with_public_and_private_subnets_per_zone(default_app: Synthesized) -> None:
    _, vpc = default_app.one("network", "AWS::EC2::VPC")
    assert vpc["Properties"]["CidrBlock"] == default_app.config.vpc_cidr
    subnets = default_app.resources("network", "AWS::EC2::Subnet").values()
    public = [s for s in subnets if s["Properties"]["MapPublicIpOnLaunch"]]
    private = [s for s in subnets if not s["Properties"]["MapPublicIpOnLaunch"]]
    assert len(public) == len(private) == default_app.config.az_count
    # One NAT gateway per zone, so losing a zone does not cut the others off.
    assert (
        len(default_app.resources("network", "AWS::EC2::NatGateway")) == default_app.config.az_count
    )


def test_flow_logs_capture_all_traffic(default_app: Synthesized) -> None:
    _, flow_log = default_app.one("network", "AWS::EC2::FlowLog")
    assert flow_log["Properties"]["TrafficType"] == "ALL"
    assert flow_log["Properties"]["ResourceType"] == "VPC"


def test_gateway_and_interface_endpoints(default_app: Synthesized) -> None:
    endpoints = default_app.resources("network", "AWS::EC2::VPCEndpoint").values()
    gateway = [
        _service(e) for e in endpoints if e["Properties"].get("VpcEndpointType") == "Gateway"
    ]
    assert sorted(name.rsplit(".", 1)[-1] for name in gateway) == ["dynamodb", "s3"]
    interface = [e for e in endpoints if e["Properties"].get("VpcEndpointType") == "Interface"]
    names = {_service(e).split("<region>.", 1)[-1] for e in interface}
    assert names == INTERFACE_SERVICES
    assert all(e["Properties"]["PrivateDnsEnabled"] for e in interface)


def test_endpoint_security_groups_admit_only_https_from_the_vpc(default_app: Synthesized) -> None:
    groups = [
        group
        for logical_id, group in default_app.resources("network", "AWS::EC2::SecurityGroup").items()
        if "Endpoint" in logical_id
    ]
    assert len(groups) == len(INTERFACE_SERVICES)
    for group in groups:
        assert group["Properties"]["SecurityGroupIngress"] == [
            {
                "CidrIp": default_app.config.vpc_cidr,
                "Description": "HTTPS from the VPC",
                "FromPort": 443,
                "IpProtocol": "tcp",
                "ToPort": 443,
            }
        ]


def test_zones_are_chosen_by_cloudformation_without_a_synth_time_lookup(
    default_app: Synthesized, pinned_app: Synthesized
) -> None:
    for synthesized in (default_app, pinned_app):
        zones = [
            subnet["Properties"]["AvailabilityZone"]
            for subnet in synthesized.resources("network", "AWS::EC2::Subnet").values()
        ]
        expected = [
            {"Fn::Select": [index, {"Fn::GetAZs": ""}]}
            for index in range(synthesized.config.az_count)
        ]
        assert sorted(map(json.dumps, zones)) == sorted(map(json.dumps, expected * 2))


def test_no_template_contains_dummy_zones(every_app: dict[str, Synthesized]) -> None:
    for name, synthesized in every_app.items():
        for stack, template in synthesized.templates.items():
            assert "dummy" not in json.dumps(template), (
                f"{name}/{stack} has dummy availability zones"
            )


def test_existing_vpc_is_referenced_not_created(existing_app: Synthesized) -> None:
    assert not existing_app.has("network")
    for template in existing_app.templates.values():
        created = {resource["Type"] for resource in template["Resources"].values()}
        assert "AWS::EC2::VPC" not in created and "AWS::EC2::VPCEndpoint" not in created
    _, hyperpod = existing_app.one("compute", "AWS::SageMaker::Cluster")
    assert hyperpod["Properties"]["VpcConfig"]["Subnets"] == [
        "subnet-0aaaaaaaaaaaaaaa1",
        "subnet-0aaaaaaaaaaaaaaa2",
    ]
