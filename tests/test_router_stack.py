"""The router's long-lived resources in the pipeline stack: table, proxy URL, consumer, grants."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import botocore.loaders
import pytest

from domain.nova_job import rollout_function_name
from stacks.components.lambda_code import PACKAGES, REQUIREMENTS
from stacks.components.router import CONSUMER_HANDLER, FORWARDER_HANDLER, PROXY_HANDLER
from stacks.components.serverless_plane import AGENT_HANDLER
from stacks.config import ConfigError, PlatformConfig
from tests.conftest import (
    Synthesized,
    as_list,
    handler_of,
    policy_statements,
    role_statements,
    synthesize,
)
from tests.forge_sdk import sdk_compiled, sdk_enums
from tests.packaging import OPTIONAL_IMPORTS
from tests.test_scan import skips


def _functions(app: Synthesized) -> dict[str, tuple[str, dict]]:
    return {
        handler_of(fn): (logical_id, fn)
        for logical_id, fn in app.resources("pipeline", "AWS::Lambda::Function").items()
        if handler_of(fn).startswith("lambdas.router.")
    }


def test_conversation_table(default_app: Synthesized) -> None:
    (table,) = [
        t
        for key, t in default_app.resources("pipeline", "AWS::DynamoDB::Table").items()
        if key.startswith("RouterConversations")
    ]
    properties = table["Properties"]
    assert properties["KeySchema"] == [
        {"AttributeName": "run_id", "KeyType": "HASH"},
        {"AttributeName": "item", "KeyType": "RANGE"},
    ]
    assert properties["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert properties["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert properties["SSESpecification"]["SSEType"] == "KMS"


def test_handlers_exist_and_run_on_python_312(default_app: Synthesized) -> None:
    functions = _functions(default_app)
    assert set(functions) == {
        "lambdas.router.proxy.handler",
        "lambdas.router.consumer.handler",
        "lambdas.router.rollout_forwarder.handler",
        "lambdas.router.agent_forwarder.handler",  # the serverless plane's (serverless_plane.py)
    }
    for handler, (_, function) in functions.items():
        module, name = handler.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(module), name))
        assert function["Properties"]["Runtime"] == "python3.12"
        assert function["Properties"]["TracingConfig"] == {"Mode": "Active"}


def test_proxy_is_behind_an_iam_authenticated_function_url(default_app: Synthesized) -> None:
    _, url = default_app.one("pipeline", "AWS::Lambda::Url")
    proxy_id, _ = _functions(default_app)["lambdas.router.proxy.handler"]
    assert url["Properties"]["AuthType"] == "AWS_IAM"
    assert url["Properties"]["TargetFunctionArn"] == {"Fn::GetAtt": [proxy_id, "Arn"]}


def test_queue_permissions_are_limited_to_the_deployments_run_queues(
    default_app: Synthesized,
) -> None:
    template = default_app.template("pipeline")
    for handler, (_, function) in _functions(default_app).items():
        role_id = function["Properties"]["Role"]["Fn::GetAtt"][0]
        sqs_statements = [
            s
            for s in role_statements(template, role_id)
            if any(a.startswith("sqs:") for a in as_list(s["Action"]))
        ]
        assert sqs_statements, handler
        for statement in sqs_statements:
            assert json.dumps(statement["Resource"]).endswith(':nova-mtrl-run-*"]]}')
        actions = {a for s in sqs_statements for a in as_list(s["Action"])}
        if handler.endswith("proxy.handler"):
            assert actions == {"sqs:SendMessage"}
        elif handler.endswith(("rollout_forwarder.handler", "agent_forwarder.handler")):
            # It finds the invoking run's queue by name, and sends; it reads nothing.
            assert actions == {"sqs:GetQueueUrl", "sqs:SendMessage"}
        else:
            assert "sqs:ReceiveMessage" in actions and "sqs:SendMessage" not in actions


def test_only_nova_jobs_invoke_the_rollout_lambda_and_only_as_the_sdk_names_it(
    default_app: Synthesized,
) -> None:
    """A Nova job's recipe names the forwarder's ARN unqualified (the Forge SDK's form): that
    ARN, nothing wider (no version, no alias), is what the restricted group's role may invoke,
    and no role of any stack may make, change or invoke a version or alias of a function."""
    forwarder_id, _ = _functions(default_app)["lambdas.router.rollout_forwarder.handler"]
    invokers = []
    for template in default_app.templates.values():
        for policy_id, statement in policy_statements(template):
            actions = as_list(statement["Action"])
            assert not [a for a in actions if a.startswith("lambda:") and "Alias" in a]
            assert not [a for a in actions if a.startswith("lambda:") and "Version" in a]
            resources = json.dumps(statement["Resource"])
            if "lambda:InvokeFunction" in actions and forwarder_id in resources:
                assert statement["Resource"] == {"Fn::GetAtt": [forwarder_id, "Arn"]}
                invokers.append(policy_id)
    assert len(invokers) == 1 and invokers[0].startswith("NovaJobRolePolicy"), invokers


def test_reward_workers_may_call_the_proxy_url(default_app: Synthesized) -> None:
    policies = default_app.resources("pipeline", "AWS::IAM::Policy").values()
    proxy_id, _ = _functions(default_app)["lambdas.router.proxy.handler"]
    granted = [
        policy
        for policy in policies
        if any(
            "lambda:InvokeFunctionUrl" in as_list(s["Action"])
            and s["Resource"] == {"Fn::GetAtt": [proxy_id, "Arn"]}
            for s in policy["Properties"]["PolicyDocument"]["Statement"]
        )
    ]
    (policy,) = granted
    (role,) = policy["Properties"]["Roles"]
    assert "RewardFleetTaskRole" in json.dumps(role)  # the compute stack's, by its export
    # No other statement in any stack lets a principal call a function URL or the proxy, and
    # no resource policy opens it to another account or to everyone.
    proxy = {"Fn::GetAtt": [proxy_id, "Arn"]}
    others = [
        (name, statement)
        for name, template in default_app.templates.items()
        for _, statement in policy_statements(template)
        if statement not in policy["Properties"]["PolicyDocument"]["Statement"]
        and (
            any(a in ("lambda:InvokeFunctionUrl", "lambda:*") for a in as_list(statement["Action"]))
            or (
                "lambda:InvokeFunction" in as_list(statement["Action"])
                and proxy in as_list(statement["Resource"])
            )
        )
    ]
    assert others == []
    assert not [
        permission
        for permission in default_app.resources("pipeline", "AWS::Lambda::Permission").values()
        if permission["Properties"]["FunctionName"] == proxy
        or "FunctionUrlAuthType" in permission["Properties"]
    ]


def test_lambda_code_needs_only_what_the_asset_ships() -> None:
    probe = (
        "import sys; import lambdas.router.proxy, lambdas.router.consumer, "
        "lambdas.router.rollout_forwarder; "
        "print(sorted({m.split('.')[0] for m in sys.modules}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )
    loaded = set(json.loads(result.stdout.replace("'", '"')))
    shipped = (
        set(PACKAGES)
        | {r.split("==")[0].replace("-", "_") for r in REQUIREMENTS}
        | {"pydantic_core", "typing_extensions", "annotated_types", "typing_inspection"}
    )
    # The Lambda runtime ships boto3 and its dependencies.
    runtime = {"boto3", "botocore", "jmespath", "dateutil", "urllib3", "s3transfer", "six"}
    third_party = {m for m in loaded if m not in sys.stdlib_module_names and not m.startswith("_")}
    needed = third_party - OPTIONAL_IMPORTS
    assert needed <= shipped | runtime, sorted(needed - shipped - runtime)


def test_the_router_may_reserve_its_concurrency(tmp_path) -> None:
    """router_reserved_concurrency: the proxy, consumer and forwarders get it (checkov's
    CKV_AWS_115 then needs no justification on them); the pipeline's functions do not."""
    app = synthesize({"router_reserved_concurrency": 40}, tmp_path)
    functions = app.resources("pipeline", "AWS::Lambda::Function")
    reserved = {
        handler_of(fn): fn["Properties"]["ReservedConcurrentExecutions"]
        for fn in functions.values()
        if "ReservedConcurrentExecutions" in fn["Properties"]
    }
    assert reserved == {
        PROXY_HANDLER: 40, CONSUMER_HANDLER: 40, FORWARDER_HANDLER: 40, AGENT_HANDLER: 40,
    }  # fmt: skip
    for handler in reserved:
        assert "CKV_AWS_115" not in skips(_functions(app)[handler][1])
    with pytest.raises(ConfigError, match="router_reserved_concurrency"):
        PlatformConfig.from_context({"router_reserved_concurrency": 0})


def _sdk_accepts_for_hyperpod(lambda_name: str) -> bool:
    """The Forge SDK's own check of the Lambda a Nova job on HyperPod invokes
    (validation/validator.py `validate_rft_lambda_name`, compiled from amzn-nova-forge 1.4.10)."""
    platform = sdk_enums().Platform
    validate = sdk_compiled(
        "validation/validator.py", "validate_rft_lambda_name", {"Platform": platform}
    )
    try:
        validate(lambda_name, platform.SMHP)
    except ValueError:
        return False
    return True


def test_the_rollout_lambda_is_named_as_aws_tools_want_a_nova_jobs_lambda(
    default_app: Synthesized,
) -> None:
    """The SDK refuses a HyperPod job's Lambda without "SageMaker" in its name; ours has it,
    named after the deployment, where CloudFormation's generated name would not."""
    _, forwarder = _functions(default_app)[FORWARDER_HANDLER]
    name = forwarder["Properties"]["FunctionName"]
    assert name == "nova-mtrl-SageMaker-rollout" == rollout_function_name("nova-mtrl")
    assert _sdk_accepts_for_hyperpod(name)
    assert not _sdk_accepts_for_hyperpod("nova-mtrl-pipeline-RouterRolloutForwarderA1B2C3")
    # botocore's Lambda model, CreateFunction's FunctionName: "limited to 64 characters".
    model = botocore.loaders.Loader().load_service_model("lambda", "service-2")
    shape = model["shapes"][model["operations"]["CreateFunction"]["input"]["shape"]]
    assert "limited to 64 characters" in shape["members"]["FunctionName"]["documentation"]
    metadata = PlatformConfig.model_fields["name_prefix"].metadata
    (longest_prefix,) = [m.max_length for m in metadata if hasattr(m, "max_length")]
    assert len(rollout_function_name("x" * longest_prefix)) <= 64
