"""Where the functions that call the EKS API run: in the VPC's private subnets, in the cluster's
security group, so they reach the API server's private endpoint and the public endpoint can be
closed to all but operators (`eks_public_access_cidrs`). No other function is in the VPC."""

from __future__ import annotations

import json

import pytest

from domain.needs import Need
from stacks.components.access import NEEDS
from stacks.components.nova_launcher import HANDLER as LAUNCHER_HANDLER
from stacks.config import ConfigError, PlatformConfig, deployment_context
from tests.conftest import Synthesized, as_list, handler_of, role_statements, synthesize

KUBERNETES_STEPS = {step for step, needs in NEEDS.items() if Need.KUBERNETES in needs}
DEPLOY_TIME = {"lambdas.kubernetes.bootstrap.on_event", "lambdas.kubernetes.chart_install.on_event"}


def _functions(app: Synthesized) -> dict[str, tuple[str, dict]]:
    """handler -> (stack part, function) for every function of the app."""
    found = {}
    for part in ("pipeline", "compute"):
        for function in app.resources(part, "AWS::Lambda::Function").values():
            found[handler_of(function)] = (part, function)
    return found


def _calls_kubernetes(handler: str) -> bool:
    """A deploy-time function, a pipeline step that needs the API, or the Nova launcher (helm)."""
    return (
        handler in DEPLOY_TIME
        or handler == LAUNCHER_HANDLER
        or handler.rsplit(".", 1)[-1] in KUBERNETES_STEPS
    )


@pytest.mark.parametrize("variant", ["default", "existing"])
def test_functions_that_call_the_eks_api_run_in_the_private_subnets_in_the_clusters_group(
    every_app: dict[str, Synthesized], variant: str
) -> None:
    app = every_app[variant]
    functions = _functions(app)
    placed = {handler for handler, (_, f) in functions.items() if "VpcConfig" in f["Properties"]}
    assert placed == {handler for handler in functions if _calls_kubernetes(handler)}
    assert {"lambdas.pipeline.handlers.submit_job", "lambdas.pipeline.handlers.reap"} <= placed
    assert placed >= DEPLOY_TIME
    for handler in placed:
        part, function = functions[handler]
        config = json.dumps(function["Properties"]["VpcConfig"])
        if variant == "existing":
            assert json.loads(config)["SecurityGroupIds"] == ["sg-0123456789abcdef0"]
            assert json.loads(config)["SubnetIds"] == list(
                app.config.existing_vpc.private_subnet_ids
            )
        else:
            assert "ClusterSecurityGroupId" in config, handler
            assert "privateSubnet" in config and "publicSubnet" not in config, handler


def test_their_roles_may_manage_network_interfaces_only_there(default_app: Synthesized) -> None:
    """The actions Lambda takes with a VPC function's role (Lambda Developer Guide, "Giving
    Lambda functions access to resources in an Amazon VPC"; AWS's AWSLambdaENIManagementAccess
    lists the same five), scoped to the function's subnets and security group."""
    part, function = _functions(default_app)["lambdas.pipeline.handlers.monitor"]
    template = default_app.template(part)
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    statements = role_statements(template, role)
    create = [s for s in statements if "ec2:CreateNetworkInterface" in as_list(s["Action"])]
    (resources,) = [as_list(s["Resource"]) for s in create]
    text = json.dumps(resources)
    assert "network-interface/*" in text and ":security-group/" in text
    assert text.count(":subnet/") == 2  # the two private subnets, no public one
    describe = [s for s in statements if "ec2:DescribeNetworkInterfaces" in as_list(s["Action"])]
    assert [s["Resource"] for s in describe] == ["*"]  # works on all resources only
    # The ENI actions appear in no role of a function outside the VPC.
    _, validate = _functions(default_app)["lambdas.pipeline.handlers.validate"]
    outside = role_statements(template, validate["Properties"]["Role"]["Fn::GetAtt"][0])
    assert not any("ec2:" in json.dumps(s["Action"]) for s in outside)


def test_the_api_is_private_unless_operators_name_addresses_for_it(
    tmp_path_factory: pytest.TempPathFactory, default_app: Synthesized
) -> None:
    _, cluster = default_app.one("compute", "AWS::EKS::Cluster")
    vpc_config = cluster["Properties"]["ResourcesVpcConfig"]
    assert (vpc_config["EndpointPublicAccess"], vpc_config["EndpointPrivateAccess"]) == (
        False,
        True,
    )
    assert "PublicAccessCidrs" not in vpc_config
    assert not _warnings(default_app, "nova-mtrl:eks-endpoint-open")
    office = synthesize(
        {"eks_public_access_cidrs": ["203.0.113.0/24", "198.51.100.7/32"]},
        tmp_path_factory.mktemp("office"),
    )
    _, cluster = office.one("compute", "AWS::EKS::Cluster")
    vpc_config = cluster["Properties"]["ResourcesVpcConfig"]
    assert vpc_config["PublicAccessCidrs"] == ["203.0.113.0/24", "198.51.100.7/32"]
    assert (vpc_config["EndpointPublicAccess"], vpc_config["EndpointPrivateAccess"]) == (True, True)
    assert not _warnings(office, "nova-mtrl:eks-endpoint-open")


def test_a_public_endpoint_open_to_the_internet_is_warned_about(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    anywhere = synthesize(
        {"eks_public_access_cidrs": ["0.0.0.0/0"]}, tmp_path_factory.mktemp("anywhere")
    )
    (warning,) = _warnings(anywhere, "nova-mtrl:eks-endpoint-open")
    assert "admits the whole internet" in warning


def _warnings(app: Synthesized, warning_id: str) -> list[str]:
    return [
        str(entry["data"])
        for metadata in app.outdir.glob("*.metadata.json")
        for entries in json.loads(metadata.read_text()).values()
        for entry in entries
        if entry["type"] == "aws:cdk:warning" and warning_id in str(entry["data"])
    ]


def test_a_bad_cidr_names_the_key_the_value_and_the_form() -> None:
    with pytest.raises(ConfigError) as raised:
        PlatformConfig.from_context(
            {**deployment_context(), "eks_public_access_cidrs": ["203.0.113.0/33"]}
        )
    message = str(raised.value)
    assert "eks_public_access_cidrs" in message and "203.0.113.0/33" in message
    assert "IPv4 CIDR block such as 203.0.113.0/24" in message
