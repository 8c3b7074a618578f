"""The IAM proof: with the pipeline's scenarios played offline on its AWS backends (every
function, worker and pod signing as its own role), every AWS request and every Kubernetes
request is checked against what the synthesized templates grant the principal that made it."""

from __future__ import annotations

import json
from unittest.mock import ANY

import pytest

from domain.kubernetes_rbac import rbac_of
from domain.naming import DEPLOYMENT_TAG
from tests.iam.conftest import ON_ONE_WORKER, Scenarios
from tests.iam.policy import Request, as_list, matches
from tests.iam.proof import Proof, Report, explained
from tests.iam.world import ACCOUNT, OPERATOR, REGION, role_of

pytestmark = ON_ONE_WORKER


def _proof(scenarios: Scenarios) -> Proof:
    world = scenarios.world
    operator = world.deployment.managed_policy("OperatorPolicy")
    return Proof(world.deployment, world.directory, policies={OPERATOR: operator})


@pytest.fixture(scope="module")
def report(scenarios: Scenarios) -> Report:
    world = scenarios.world
    proof = _proof(scenarios)
    checked = proof.check(world.recorder.calls)
    (rbac,) = [r for _, _, r in world.deployment.resources("Custom::KubernetesRbac")]
    prefix = world.app.config.name_prefix
    proof.check_kubernetes(checked, world.kubernetes.callers, rbac_of(prefix, rbac["Properties"]))
    return checked


def test_every_aws_request_is_allowed(report: Report, scenarios: Scenarios) -> None:
    # Enough of the platform's behaviour that a missing grant would show: most of what the
    # pipeline, router, planes and CLI do (see docs/operators/security.md for the last count).
    assert report.requests > 500 and len(report.pairs) > 150
    assert report.denied == [], "\n".join(sorted(set(report.denied)))
    # Complete: no principal that made a request holds an AWS managed policy the proof cannot
    # read — but the restricted group's execution role, which AWS makes the Nova job's identity
    # as well as its nodes' (their instance policy); the job's requests are proven on its own
    # statements alone.
    roles = scenarios.world.deployment.roles
    assert not [
        p for p in {n.principal for n in report.needs}
        if p in roles and roles[p].managed_policies and "RestrictedExecutionRole" not in p
    ]  # fmt: skip


def test_every_kubernetes_request_is_allowed(report: Report) -> None:
    assert report.kubernetes_denied == [], "\n".join(sorted(set(report.kubernetes_denied)))


def test_the_state_machine_may_invoke_every_function_its_states_call(scenarios: Scenarios) -> None:
    """Step Functions invokes each Task's function with the state machine's role."""
    deployment = scenarios.world.deployment
    ((stack, logical_id, machine),) = deployment.resources("AWS::StepFunctions::StateMachine")
    definition = json.loads(deployment.resolve(stack, machine["Properties"]["DefinitionString"]))
    # Tasks invoke their function directly (payload only): the Resource is its ARN.
    functions = {
        state["Resource"] for state in definition["States"].values() if state["Type"] == "Task"
    }
    assert len(functions) >= 12
    role = deployment.resolve(stack, machine["Properties"]["RoleArn"])
    policies = deployment.policies(role)
    for function in functions:
        assert policies.evaluate(Request("lambda:InvokeFunction", function)).allowed, function


def test_each_rule_may_invoke_its_target_and_dead_letter_its_events(scenarios: Scenarios) -> None:
    """EventBridge needs the target function's resource policy (and the dead-letter queue's)
    to name the rule (EventBridge User Guide, "Using resource-based policies")."""
    deployment = scenarios.world.deployment
    permissions = [
        deployment.resolve(stack, resource["Properties"])
        for stack, _, resource in deployment.resources("AWS::Lambda::Permission")
    ]
    queue_policies = [
        deployment.resolve(stack, resource["Properties"])
        for stack, _, resource in deployment.resources("AWS::SQS::QueuePolicy")
    ]
    rules = list(deployment.resources("AWS::Events::Rule"))
    assert len(rules) >= 2
    for stack, logical_id, rule in rules:
        rule_arn = deployment.names[stack][logical_id]["Arn"]
        for target in deployment.resolve(stack, rule["Properties"]["Targets"]):
            assert [
                p for p in permissions
                if p["Principal"] == "events.amazonaws.com" and p["Action"] == "lambda:InvokeFunction"
                and p["FunctionName"] == target["Arn"] and p.get("SourceArn") == rule_arn
            ], f"{logical_id} cannot invoke {target['Arn']}"  # fmt: skip
            if "DeadLetterConfig" in target:
                queue = target["DeadLetterConfig"]["Arn"]
                allowing = [
                    statement
                    for policy in queue_policies
                    for statement in policy["PolicyDocument"]["Statement"]
                    if statement["Effect"] == "Allow"
                    and statement.get("Principal") == {"Service": "events.amazonaws.com"}
                    and queue in as_list(statement["Resource"])
                    and rule_arn in json.dumps(statement.get("Condition", {}))
                ]
                assert allowing, f"{logical_id}'s dead letters cannot reach {queue}"


# Grants no scenario uses, each kept for a reason: (principal pattern, action pattern) -> why.
KEPT = {
    ("*JobRole*", "s3:GetObject"): "evaluation-data/: a config's eval_dataset, which the trainer "
    "image's evaluation reads (the scenarios' runs hold a share of their dataset out instead).",
    ("*SubmitJob*", "eks:CreatePodIdentityAssociation"): "An open-weights run's first job makes "
    "the namespace's association: the baseline evaluation's (StartEvaluation) in the scenarios, "
    "the trainer's (SubmitJob) for a config that holds nothing out.",
    ("*SubmitJob*", "eks:TagResource"): "As eks:CreatePodIdentityAssociation: its tags.",
    ("*SubmitJob*", "iam:PassRole"): "As eks:CreatePodIdentityAssociation: the job role it passes.",
    ("*SubmitJob*", "s3:GetObject"): "The Forge recipes, each named: a run reads the one of its "
    "config's recipe (the scenarios' Nova run is LoRA).",
    ("*StartEvaluation*", "s3:GetObject"): "The Forge recipes, each named: an evaluation reads "
    "the evaluation recipe; and evaluation-data/, a config's eval_dataset (the scenarios' runs "
    "hold a share of their dataset out instead).",
    ("*ModelReleaseServing*", "ecr:*"): "SageMaker pulls an endpoint's image (AWS's vLLM "
    "container) with its model's execution role; no request of ours does.",
    ("*ModelReleaseServing*", "logs:*"): "SageMaker writes an endpoint's container logs to "
    "/aws/sagemaker/Endpoints/<endpoint> with its model's execution role.",
    ("*", "logs:CreateLogStream"): "The Lambda runtime (or ECS's awslogs driver) writes the "
    "function's (or task's) logs with the role; no request of the code does.",
    ("*", "logs:PutLogEvents"): "The Lambda runtime (or ECS's awslogs driver) writes the logs.",
    ("*", "xray:Put*"): "Active tracing: the Lambda runtime sends the function's trace segments.",
    ("*", "ec2:*NetworkInterface*"): "Lambda attaches a function that calls the EKS API to the VPC "
    "with its role (Lambda Developer Guide, VPC access); no request of the code does.",
    ("*", "ec2:*PrivateIpAddresses"): "As ec2:*NetworkInterface*: Lambda manages the interfaces.",
    ("*", "kms:DescribeKey"): "DynamoDB uses a table's key for its caller and does not publish "
    "which KMS calls each operation makes: callers hold what aws-cdk-lib's table grants give.",
    ("*", "kms:Encrypt"): "As kms:DescribeKey: DynamoDB writes under the table's key.",
    ("*", "kms:ReEncrypt*"): "As kms:DescribeKey: DynamoDB writes under the table's key.",
    ("*", "kms:GenerateDataKey*"): "As kms:DescribeKey: DynamoDB writes under the table's key.",
    ("*", "iam:CreateServiceLinkedRole"): "The first scalable target of an account makes "
    "Application Auto Scaling's role for ECS; every later run finds it there.",
    ("*RegisterFunctionRole*", "dynamodb:GetItem"): "A Register retried after a timeout finds the "
    "run its first attempt stored (RunStore.register).",
    ("*RestrictedExecutionRole*", "ec2:*"): "The restricted group's execution role is its nodes' "
    "as well as the Nova job's: HyperPod and the VPC CNI manage the nodes' network interfaces "
    "with it; no request of the job does.",
    ("*RestrictedExecutionRole*", "eks-auth:AssumeRoleForPodIdentity"): "As ec2:*: the nodes' "
    "Pod Identity agent uses it.",
    ("*StartRun*", "sqs:*"): "Lambda sends an upload event StartRun still failed after the "
    "asynchronous invocation's retries to its dead-letter queue, with the function's role "
    "(Lambda Developer Guide, 'Dead-letter queues'); no request of the code does.",
    ("*", "sqs:ChangeMessageVisibility"): "Workers and trainers extend a long episode's message "
    "(the worker's heartbeat); these episodes end sooner.",
    ("*RestrictedExecutionRole*", "sagemaker-mlflow:*"): "AWS's Nova trainer logs to the MLflow "
    "server its recipe names (`run.mlflow_tracking_uri`) with the job's role; the scenarios' "
    "stand-in trainer does not log. Which calls AWS's makes is unverified: the grant is what an "
    "MLflow client's run takes (experiment by name or new, run, batches, end).",
    ("*RestrictedExecutionRole*", "s3:PutObject"): "As sagemaker-mlflow:*: AWS's trainer may put "
    "files in the server's artifact store (mlflow/).",
    ("*RestrictedExecutionRole*", "s3:ListBucket"): "As sagemaker-mlflow:*: the tracking grant's "
    "look at runs/ (the job reads its outputs by name).",
    ("*Reaper*", "sagemaker:StopJob"): "A serverless run torn down while its managed job runs; "
    "the scenarios' serverless run ends with its job.",
    ("*ReleaseCompute*", "sagemaker:StopJob"): "As the reaper's: a job still running at release.",
    ("*agent-rft-job*", "*"): "What AWS's managed job does with its role beside reading its "
    "channel and invoking the agent is AWS's and unpublished beyond the managed policy "
    "AmazonSageMakerJobFullAccess (outputs, model packages, its logs, the hub): granted narrowed, "
    "unverified until a job runs.",
}
# Dependent actions (Service Authorization Reference) that the calls made here do not need.
NOT_NEEDED = {
    ("sagemaker:UpdateCluster", "ec2:*"): "For a custom AMI (ImageId) only; a capacity change "
    "sends none (lambdas/pipeline/hyperpod_capacity.py leaves images as they are).",
    ("application-autoscaling:RegisterScalableTarget", "application-autoscaling:TagResource"): (
        "For tags on the scalable target; none are sent."
    ),
    ("cloudformation:DescribeStacks", "cloudformation:ListStacks"): "For describing every stack "
    "at once; mtrl names each of its stacks.",
    ("servicequotas:ListServiceQuotas", "*"): "For the quotas of those services (Auto Scaling, "
    "DynamoDB, ...); mtrl doctor lists SageMaker's only.",
    ("sagemaker:CreateModelPackage", "sagemaker:AddTags"): "For tags on the model package; "
    "mtrl deploy sends none (the run is in its metadata).",
}


def test_every_grant_is_used_or_kept_for_a_reason(scenarios: Scenarios, report: Report) -> None:
    proof = _proof(scenarios)
    exercised = sorted({need.principal for need in report.needs})
    assert len(exercised) >= 19
    unexplained = [
        f"{principal.rsplit('/', 1)[-1]}: {grant.action} on {grant.resource}"
        for principal, grants in proof.unused(report, exercised).items()
        for grant in grants
        if explained(grant, principal, KEPT) is None
    ]
    assert unexplained == [], "\n".join(unexplained)


def test_every_dependent_action_is_granted_or_not_needed(
    report: Report, scenarios: Scenarios
) -> None:
    missing = sorted(
        {
            f"{d.principal.rsplit('/', 1)[-1]}: {d.action} depends on {d.dependent}"
            for d in report.dependents
            if not _proof(scenarios).policies(d.principal).allows_action(d.dependent)
            and not any(
                matches(action, d.action) and matches(dependent, d.dependent)
                for action, dependent in NOT_NEEDED
            )
        }
    )
    assert report.dependents and missing == [], "\n".join(missing)


def test_the_operator_runs_every_mtrl_command_on_the_operator_policy(
    scenarios: Scenarios, report: Report
) -> None:
    """Each command did its work (doctor finds only the worker image missing: moto's ECR has
    none), and every request it made is among those proven allowed above."""
    results = {name: (result.exit_code, result.output) for name, result in scenarios.cli.items()}
    assert {name for name, (code, _) in results.items() if code != 0} == {"doctor"}, results
    assert "FAIL │ worker image" in results["doctor"][1].replace("  ", " ")
    assert "torn down" in results["teardown"][1] and "$99/h" in results["cost"][1]
    kept = scenarios.exchange["trajectories"]
    assert kept == scenarios.exchange["completed"] > 0
    assert f"1 of {kept} trajectories" in results["trajectories"][1]
    # The Nova run's model: registered, imported from its checkpoint, deployed, then deleted.
    assert "deployed on Bedrock: invoke arn:aws:bedrock:" in results["deploy"][1]
    assert results["deploy --delete"][1].startswith("deleted: arn:aws:bedrock:")
    nova = scenarios.runs["nova succeeds"]
    (checkpoint,) = nova.summary["checkpoints"]
    assert scenarios.world.bedrock.operations("CreateCustomModel")[0]["modelSourceConfig"] == {
        "s3DataSource": {"s3Uri": checkpoint["uri"]}
    }
    # The serverless run: the tokens its managed job reported AWS billed it (no price known).
    assert (
        "tokens SageMaker billed its managed job: 48,000 train, 36,000 prefill, 12,000 sample"
        in (results["cost serverless"][1])
    )
    # The serverless run's model: the package its managed job registered, imported by its ARN
    # (the operator may read that package's data, nothing else of the registry's), deployed,
    # then deleted.
    assert "deployed on Bedrock: invoke arn:aws:bedrock:" in results["deploy serverless"][1]
    assert results["deploy serverless --delete"][1].startswith("deleted: arn:aws:bedrock:")
    package = scenarios.runs["serverless succeeds"].summary["model_package"]
    assert scenarios.world.bedrock.operations("CreateCustomModel")[1] == {
        "modelName": f"{scenarios.world.app.config.name_prefix}-run-"
        f"{scenarios.runs['serverless succeeds'].run_id}",
        "customModelDataSource": {"modelPackageArnDataSource": {"modelPackageArn": package}},
        "modelTags": ANY,
    }
    read = {
        n.request.action
        for n in report.needs
        if n.principal == OPERATOR and n.request.resource == package
    }
    assert read == {"sagemaker:DescribeModelPackage", "sagemaker:AccessModelPackage"}
    # The open-weights run's LoRA adapter: served on its Hub base model by a SageMaker endpoint,
    # which read the run's final checkpoint with the serving role; then deleted.
    assert "deployed on SageMaker: endpoint " in results["deploy open weights"][1]
    assert results["deploy open weights --delete"][1].startswith("deleted: endpoint ")
    (model,) = scenarios.world.hosting.operations("CreateModel")
    assert model["PrimaryContainer"]["Environment"]["SM_VLLM_MODEL"] == "Qwen/Qwen3-8B"
    served = scenarios.runs["succeeds"].summary["best_checkpoint"]["uri"]
    assert model["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]["S3Uri"] == served
    serving = model["ExecutionRoleArn"]
    assert {n.request.action for n in report.needs if n.principal == serving} == {
        "s3:ListBucket",
        "s3:GetObject",
        "kms:Decrypt",
    }
    assert scenarios.world.hosting.endpoints == {}
    operator_actions = {n.request.action for n in report.needs if n.principal == OPERATOR}
    assert {
        "cloudformation:DescribeStacks", "s3:PutObject", "dynamodb:Scan", "states:GetExecutionHistory",
        "logs:FilterLogEvents", "lambda:InvokeFunction", "sagemaker:DescribeCluster",
        "bedrock:CreateCustomModel", "iam:PassRole",
        "bedrock:CreateCustomModelDeployment", "bedrock:DeleteCustomModel",
        "sagemaker:CreateModel", "sagemaker:CreateEndpoint", "sagemaker:AddTags",
        "sagemaker:DeleteEndpoint",
    } <= operator_actions  # fmt: skip


def test_the_open_weights_trainers_generation_service_answers_as_the_pods_role(
    scenarios: Scenarios, report: Report
) -> None:
    """The run stopped by hand played its rollouts against llm_trainer's own GenerationService
    (tests/iam/world.py): its receives, batched answers and deletes are among the requests
    proven allowed, made with the run pods' role."""
    pods = role_of(scenarios.world.deployment, "pipeline", "TrainingClusterControlJobRole")
    made = {(n.why, n.request.action, n.request.resource.split(":")[-1])
            for n in report.needs if n.principal == pods}  # fmt: skip
    # The service's own calls: batches of answers and of deletes (a scripted stand-in's are
    # single messages).
    for call, action, queue in (
        ("sqs.ReceiveMessage", "sqs:ReceiveMessage", "-generate-requests.fifo"),
        ("sqs.SendMessageBatch", "sqs:SendMessage", "-generate-responses.fifo"),
        ("sqs.DeleteMessageBatch", "sqs:DeleteMessage", "-generate-requests.fifo"),
    ):
        assert any(c == call and a == action and r.endswith(queue) for c, a, r in made), call
    assert scenarios.exchange["turns"] >= 3 * scenarios.exchange["completed"] > 0  # 3 guesses


def test_the_operator_releases_and_deletes_only_this_deployments_bedrock_models(
    scenarios: Scenarios,
) -> None:
    """The operator's Bedrock grants, on what `mtrl deploy` tags (DEPLOYMENT_TAG): creating a
    model that does not carry the deployment's tag, and deploying or deleting another's model
    or deployment, are denied; reading by name is not (a name not there is an answer)."""
    operator = _proof(scenarios).policies(OPERATOR)
    assert operator is not None
    prefix = scenarios.world.app.config.name_prefix
    model = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:custom-model/imported/abc123"
    deployment = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:custom-model-deployment/def456"
    ours, theirs = (
        {f"aws:ResourceTag/{DEPLOYMENT_TAG}": prefix},
        {f"aws:ResourceTag/{DEPLOYMENT_TAG}": "another-team"},
    )

    def allowed(action: str, resource: str, context: dict) -> bool:
        return operator.evaluate(Request(f"bedrock:{action}", resource, context)).allowed

    for action in ("DeleteCustomModel", "CreateCustomModelDeployment"):
        assert allowed(action, model, ours) and not allowed(action, model, theirs)
        assert not allowed(action, model, {})
    assert allowed("DeleteCustomModelDeployment", deployment, ours)
    assert not allowed("DeleteCustomModelDeployment", deployment, theirs)
    assert allowed("GetCustomModel", model, {})
    tagged = {f"aws:RequestTag/{DEPLOYMENT_TAG}": prefix}
    assert allowed("CreateCustomModel", "*", tagged) and not allowed("CreateCustomModel", "*", {})
