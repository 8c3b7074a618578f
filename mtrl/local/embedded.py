"""The synthesized pipeline, deployed into moto and executed locally with the real handlers.

From the pipeline stack's template it creates what the state machine needs (runs and
conversation tables, the alert topic, one Lambda function per function resource, the state
machine with its definition resolved to those local resources) and dispatches every Lambda
invocation in-process to the handler the template names, with that function's environment.
The upload rule's pattern is taken from the template and evaluated against the S3 event,
since moto cannot start a state machine from a rule. Used by local mode and the tests.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import boto3
import botocore.loaders
import botocore.session
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.stepfunctions.parser.asl.eval.environment import Environment as ProgramEnvironment
from moto.stepfunctions.parser.asl.eval.program_state import ProgramStopped

from domain.nova_job import NOVA_INSTANCE_TYPE
from lambdas.clients import Clients, Compose, Handler
from lambdas.kubernetes import bootstrap, chart_install
from lambdas.launcher import handler as launcher
from lambdas.pipeline.composition import compose as compose_pipeline
from lambdas.pipeline.dependencies import Compute
from lambdas.pipeline.steps import STEPS
from lambdas.pipeline.training_metrics import TrainingMetrics
from lambdas.router.agent_forwarder import AgentForwarder
from lambdas.router.consumer import consumer_for
from lambdas.router.proxy import proxy_for
from lambdas.router.rollout_forwarder import RolloutForwarder, forwarder_for
from mtrl.local.physical import ACCOUNT, REGION, LocalNames

Fault = Callable[[str, dict[str, Any]], None]
# What the functions are told when the compute given stands in for both training planes (local
# mode's trainer): Register then lets a Nova model run without a restricted group.
STAND_IN_PLANES = {"NOVA_INSTANCE_TYPE": NOVA_INSTANCE_TYPE}
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def _pipeline(compute: Compute | None, training_metrics: TrainingMetrics | None) -> Compose:
    return lambda environment, clients: compose_pipeline(
        environment, clients, compute=compute, training_metrics=training_metrics
    )


# The other Lambda entry modules' compositions (what their handlers are made of), by module;
# the pipeline's is made with the compute planes given (`composed_handler`).
_COMPOSERS: dict[str, Compose] = {
    "lambdas.router.proxy": lambda env, clients: {"handler": proxy_for(env, clients).handle},
    "lambdas.router.consumer": lambda env, clients: {"handler": consumer_for(env, clients).handle},
    # The local trainer puts its rollout requests on the run's queue itself, so nothing invokes
    # it here.
    "lambdas.router.rollout_forwarder": lambda env, clients: {
        "handler": forwarder_for(env, clients, RolloutForwarder).handle
    },
    # The serverless plane's agent Lambda: the managed job (or its local stand-in) invokes it.
    "lambdas.router.agent_forwarder": lambda env, clients: {
        "handler": forwarder_for(env, clients, AgentForwarder).handle
    },
    "lambdas.kubernetes.bootstrap": bootstrap.compose,
    "lambdas.kubernetes.chart_install": chart_install.compose,
    # A deployment with a restricted group has the Nova launcher; local runs never call it.
    "lambdas.launcher.handler": launcher.compose,
}


class _SearchPathsOnce(list[str]):
    """boto3 adds its data folder to the loader of each session it makes: to a loader every
    session shares, once."""

    def append(self, path: str) -> None:
        if path not in self:
            super().append(path)


# botocore's data (service models, endpoints, rule sets), read once for every function's
# session: on Lambda each function is a process of its own and reads it once; here, one process
# of them all, each function's session would read it again (~0.1-0.2 s a client).
_BOTOCORE_DATA = botocore.loaders.Loader(extra_search_paths=_SearchPathsOnce())


def function_session(*, region_name: str = REGION, **credentials: str | None) -> boto3.Session:
    """A session for one of this process's principals (`credentials`: boto3.Session's, none:
    the process's), reading botocore's data once with every other."""
    core = botocore.session.Session()
    core.register_component("data_loader", _BOTOCORE_DATA)
    return boto3.Session(**credentials, region_name=region_name, botocore_session=core)


def composed_handler(
    handler: str,
    environment: Mapping[str, str],
    *,
    compute: Compute | None = None,
    training_metrics: TrainingMetrics | None = None,
    composers: Mapping[str, Compose] | None = None,
) -> Handler:
    """The function as Lambda runs it: its handler composed, at its first invocation, from its
    own environment, with AWS clients signed with the credentials that environment names (its
    role's; none: the process's). The pipeline's steps use `compute` if given, else the
    deployed planes, and Monitor publishes to `training_metrics` if given, else to its log;
    `composers` replace the composition of entry modules (by module)."""
    module, name = handler.rsplit(".", 1)
    composers = {
        "lambdas.pipeline.handlers": _pipeline(compute, training_metrics),
        **_COMPOSERS,
        **(composers or {}),
    }
    if module not in composers:
        raise LookupError(f"no local composition for the handler {handler}")
    # What Lambda's runtime adds to every function's environment.
    environment = {"AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION, **environment}

    @functools.cache
    def composed() -> Handler:
        session = function_session(
            aws_access_key_id=environment.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=environment.get("AWS_SECRET_ACCESS_KEY"),
            aws_session_token=environment.get("AWS_SESSION_TOKEN"),
        )
        return composers[module](environment, Clients(session))[name]

    return lambda event: composed()(event)


@dataclass
class Dispatcher:
    """Runs the Lambda functions of the local deployment in-process, concurrently as Lambda does:
    each function by name, its handler composed from its own settings (`composed_handler`)."""

    functions: dict[str, Handler] = field(default_factory=dict)
    handlers: dict[str, str] = field(default_factory=dict)  # name -> the template's handler
    fault: Fault | None = None
    invocations: list[str] = field(default_factory=list)

    def add(self, name: str, handler: str, run: Handler) -> None:
        """Function `name`, whose template names `handler`, runs `run`."""
        self.functions[name], self.handlers[name] = run, handler

    def call(self, function: str, event: dict[str, Any]) -> Any:
        """Invoke a function by name or ARN; its exception, if any, propagates."""
        name = function.rsplit(":", 1)[-1] if function.startswith("arn:") else function
        step = step_of(self.handlers[name])
        self.invocations.append(step)
        if self.fault:
            self.fault(step, event)
        return self.functions[name](event)

    def invoke(
        self,
        backend: Any,
        function_name: str,
        qualifier: str | None,
        body: Any,
        headers: Any,
        response_headers: Any,
    ) -> bytes:
        """moto's Lambda invoke: the result, or the error as Lambda reports it to Step Functions."""
        try:
            return json.dumps(self.call(function_name, json.loads(body or "{}"))).encode()
        except Exception as error:  # noqa: BLE001 - reported to Step Functions as Lambda does
            response_headers["x-amz-function-error"] = "Unhandled"
            return json.dumps(
                {"errorType": type(error).__name__, "errorMessage": str(error)}
            ).encode()


_DISPATCHER = Dispatcher()
_ORIGINAL_INVOKE = LambdaSimpleBackend.invoke
_DEFAULT_SESSION_LOCK = threading.Lock()
_ORIGINAL_SET_ERROR = ProgramEnvironment.set_error


def _set_error_unless_stopped(self: ProgramEnvironment, error: Any) -> None:
    """An execution stopped stays ABORTED, as on AWS (StopExecution): moto's interpreter fails
    one whose in-flight state ends after the stop (a stopped program takes no next state)."""
    with self._state_mutex:
        if not isinstance(self._program_state, ProgramStopped):
            _ORIGINAL_SET_ERROR(self, error)


def _one_at_a_time(make: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with _DEFAULT_SESSION_LOCK:
        return make(*args, **kwargs)


@contextmanager
def temporary_environ(values: Mapping[str, str], *, remove: tuple[str, ...] = ()) -> Iterator[None]:
    """`values` set (and `remove` unset) in os.environ for the duration; then restored."""
    saved = {key: os.environ.get(key) for key in (*values, *remove)}
    for key in remove:
        os.environ.pop(key, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def in_process_lambdas() -> Iterator[Dispatcher]:
    """While active, moto's Docker-less Lambda runs our handlers instead of echoing input; and
    where moto's Step Functions races with our handlers' threads, it keeps to what AWS does:
    clients of boto3's default session are made one at a time (the interpreter makes one per
    task from it, asl/utils/boto_client.py, while pollers and handlers make theirs in other
    threads, and making clients of one session is not thread-safe: boto/boto3#2750, "'dict'
    object has no attribute ..." at random), and a stopped execution stays stopped."""
    LambdaSimpleBackend.invoke = lambda self, *args, **kwargs: _DISPATCHER.invoke(
        self, *args, **kwargs
    )  # type: ignore[method-assign]
    make_client = boto3.client
    boto3.client = functools.partial(_one_at_a_time, make_client)  # type: ignore[assignment]
    ProgramEnvironment.set_error = _set_error_unless_stopped  # type: ignore[method-assign]
    try:
        yield _DISPATCHER
    finally:
        ProgramEnvironment.set_error = _ORIGINAL_SET_ERROR  # type: ignore[method-assign]
        boto3.client = make_client  # type: ignore[assignment]
        LambdaSimpleBackend.invoke = _ORIGINAL_INVOKE  # type: ignore[method-assign]
        _DISPATCHER.functions.clear()
        _DISPATCHER.handlers.clear()
        _DISPATCHER.fault = None
        _DISPATCHER.invocations.clear()


@dataclass
class LocalPipeline:
    state_machine_arn: str
    data_bucket: str
    environment: dict[str, str]
    upload_pattern: dict[str, Any]
    dispatcher: Dispatcher
    functions: dict[str, str]  # handler path -> local function name
    # Task state -> the step its function runs ("Validate" -> "validate").
    state_steps: dict[str, str]

    def function(self, handler: str) -> str:
        """The local function whose template names `handler` (its full path)."""
        if handler not in self.functions:
            raise LookupError(f"no function of the pipeline runs {handler}")
        return self.functions[handler]


_STEP_NAMES = {step.handler: step.name for step in STEPS}


def step_of(handler: str) -> str:
    """What a function is called in invocations and faults: a pipeline step by its name in the
    step table, any other function by its handler."""
    return _STEP_NAMES.get(handler, handler)


def function_environment(
    properties: Mapping[str, Any], resolve: Callable[[Any], Any]
) -> dict[str, str]:
    """A function's environment variables as its template sets them, resolved."""
    variables = properties.get("Environment", {}).get("Variables", {})
    return {key: str(resolve(value)) for key, value in variables.items()}


# moto's PurgeQueue deletes at once: a phase need not wait SQS's minute after it.
MOTO_SETTINGS = {"PURGE_SECONDS": "0"}


def deploy_pipeline(
    template: dict[str, Any],
    *,
    clients: Mapping[str, Any],
    dispatcher: Dispatcher,
    compute: Compute | None = None,
    training_metrics: TrainingMetrics | None = None,
    overrides: Mapping[str, str] | None = None,
    imports: Mapping[str, str] | None = None,
    credentials: Callable[[str], Mapping[str, str]] | None = None,
    keep_data_key: bool = False,
    composers: Mapping[str, Compose] | None = None,
) -> LocalPipeline:
    """Create the pipeline stack's resources in moto (inside `mock_aws` and `in_process_lambdas`),
    and the data bucket its upload rule watches (versioned, as the storage stack makes it).

    `compute`: the planes the pipeline's steps use (unset: the deployed ones, made from each
    function's environment); `training_metrics`: where Monitor publishes (unset: its log); `imports`: the other stacks' exports (unset, they resolve to "");
    `credentials(role_arn)`: the environment variables that make a function's calls its role's;
    `keep_data_key`: run queues encrypted with the data key, as deployed (local mode lets SQS
    manage the key); `composers`: entry modules composed otherwise (`composed_handler`).
    """
    resources = template["Resources"]
    names = LocalNames(template, imports)
    resolve = names.resolve
    of_type = lambda kind: {k: r for k, r in resources.items() if r["Type"] == kind}  # noqa: E731
    role = clients["iam"].create_role(RoleName="local-pipeline", AssumeRolePolicyDocument="{}")[
        "Role"
    ]["Arn"]
    for logical_id, table in of_type("AWS::DynamoDB::Table").items():
        create_table_as_declared(clients["dynamodb"], names[logical_id]["Ref"], table["Properties"])
    for logical_id in of_type("AWS::SNS::Topic"):
        clients["sns"].create_topic(Name=names[logical_id]["TopicName"])
    for group in of_type("AWS::SageMaker::ModelPackageGroup").values():
        clients["sagemaker"].create_model_package_group(
            ModelPackageGroupName=resolve(group["Properties"]["ModelPackageGroupName"])
        )
    functions = of_type("AWS::Lambda::Function")
    machine_id, machine = next(iter(of_type("AWS::StepFunctions::StateMachine").items()))
    environment: dict[str, str] = {}
    for logical_id, function in functions.items():
        properties = function["Properties"]
        variables = function_environment(properties, resolve)
        if not keep_data_key:
            variables.pop("DATA_KEY_ARN", None)  # local queues use SQS-managed encryption
        if credentials is not None:
            variables |= credentials(str(resolve(properties["Role"])))
        variables |= {**MOTO_SETTINGS, **(overrides or {})}
        name = names[logical_id]["Ref"]
        # A container image's function names its handler in the image's command.
        handler = properties.get("Handler") or properties["ImageConfig"]["Command"][0]
        clients["lambda"].create_function(
            FunctionName=name,
            Runtime="python3.12",
            Role=role,
            Handler=handler,
            Code={"ZipFile": b"in-process"},
            Environment={"Variables": variables},
        )
        dispatcher.add(
            name,
            handler,
            composed_handler(
                handler,
                variables,
                compute=compute,
                training_metrics=training_metrics,
                composers=composers,
            ),
        )
        environment |= {k: v for k, v in variables.items() if k not in CREDENTIALS}
    definition = _compress_retries(resolve(machine["Properties"]["DefinitionString"]))
    arn = clients["stepfunctions"].create_state_machine(
        name=names[machine_id]["Name"], definition=definition, roleArn=role
    )["stateMachineArn"]
    rule = next(
        r for r in of_type("AWS::Events::Rule").values() if "EventPattern" in r["Properties"]
    )
    pattern = resolve(rule["Properties"]["EventPattern"])
    (data_bucket,) = pattern["detail"]["bucket"]["name"]
    clients["s3"].create_bucket(Bucket=data_bucket)
    clients["s3"].put_bucket_versioning(
        Bucket=data_bucket, VersioningConfiguration={"Status": "Enabled"}
    )
    handlers = dict(dispatcher.handlers)
    all_states = json.loads(definition)["States"]
    state_steps = {
        state: step_of(handlers[spec["Resource"].rsplit(":", 1)[-1]])
        for state, spec in all_states.items()
        if spec["Type"] == "Task" and spec.get("Resource", "").rsplit(":", 1)[-1] in handlers
    }
    return LocalPipeline(
        arn,
        data_bucket,
        environment,
        pattern,
        dispatcher,
        functions={path: name for name, path in handlers.items()},
        state_steps=state_steps,
    )


def create_table_as_declared(dynamodb: Any, name: str, properties: Mapping[str, Any]) -> None:
    """A DynamoDB table with the keys a template declares for it (and its time to live)."""
    dynamodb.create_table(
        TableName=name,
        KeySchema=properties["KeySchema"],
        AttributeDefinitions=properties["AttributeDefinitions"],
        BillingMode="PAY_PER_REQUEST",
    )
    if "TimeToLiveSpecification" in properties:
        dynamodb.update_time_to_live(
            TableName=name, TimeToLiveSpecification=properties["TimeToLiveSpecification"]
        )


def definition_skeleton(template: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's state machine definition with its references blanked: its states' names,
    types and transitions, without deploying anything."""
    (machine,) = [
        r for r in template["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine"
    ]
    definition = machine["Properties"]["DefinitionString"]
    if isinstance(definition, dict):  # {"Fn::Join": ["", [text, {reference}, text, ...]]}
        definition = "".join(p if isinstance(p, str) else "" for p in definition["Fn::Join"][1])
    return json.loads(definition)


def fault_states(definition: dict[str, Any]) -> list[str]:
    """The Task states that have a failure path (`FailedIn<State>`): where a fault can go."""
    states = definition["States"]
    return [
        name
        for name, spec in states.items()
        if spec["Type"] == "Task" and f"FailedIn{name}" in states
    ]


def _compress_retries(definition: str) -> str:
    """Retries as many as deployed, one second apart: moto's interpreter sleeps them for real."""
    parsed = json.loads(definition)
    for state in parsed["States"].values():
        for retry in state.get("Retry", []):
            retry.update(IntervalSeconds=1, BackoffRate=1.0)
            retry.pop("MaxDelaySeconds", None)
    return json.dumps(parsed)


def upload_event(bucket: str, key: str, version_id: str | None) -> dict[str, Any]:
    """The EventBridge event S3 sends for a new object (what the upload rule sees), in the shape
    of the S3 User Guide's "Object Created" example: every field Powertools' model requires."""
    return {
        "version": "0",
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"s3://{bucket}/{key}?versionId={version_id}")),
        "source": "aws.s3",
        "detail-type": "Object Created",
        "account": ACCOUNT,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": [f"arn:aws:s3:::{bucket}"],
        "detail": {
            "version": "0",
            "bucket": {"name": bucket},
            "object": {"key": key, "version-id": version_id},
            "request-id": "LOCAL0000000000",
            "requester": ACCOUNT,
            "reason": "PutObject",
        },
    }


def matches(pattern: dict[str, Any], event: dict[str, Any]) -> bool:
    """The rule's pattern evaluated as EventBridge does (moto's implementation)."""
    from moto.events.models import EventPattern

    return EventPattern.load(json.dumps(pattern)).matches_event(event)
