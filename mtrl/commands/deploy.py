"""`mtrl deploy`: a trained model released — Nova on Bedrock, open weights on a SageMaker
endpoint — and deleted again."""

from __future__ import annotations

from dataclasses import asdict
from enum import StrEnum
from typing import Annotated, Any

import typer

from mtrl.commands.aws import (
    AsJson,
    Prefix,
    Profile,
    Region,
    apply_change,
    deployed,
)
from mtrl.console import err
from mtrl.ops.deploy import (
    WAIT_SECONDS,
    DeployFailed,
    DeployRefused,
    Waiting,
    delete_from_bedrock,
    deploy_to_bedrock,
    target_of,
)
from mtrl.ops.endpoint import DEFAULT_INSTANCE_TYPE, delete_from_sagemaker, deploy_to_sagemaker


class Target(StrEnum):
    bedrock = "bedrock"
    sagemaker = "sagemaker"


def deploy_command(
    run_id: Annotated[str, typer.Argument(help="The run whose trained model to deploy.")],
    to: Annotated[
        Target | None,
        typer.Option(
            "--to",
            help="bedrock (a Nova model: custom model, on-demand deployment) or sagemaker (an "
            "open-weights model: a real-time endpoint with AWS's vLLM container); default: "
            "the one for the run's model.",
        ),
    ] = None,
    delete: Annotated[
        bool, typer.Option("--delete", help="Delete what deploying the run made there.")
    ] = False,
    instance_type: Annotated[
        str, typer.Option(help="sagemaker: the endpoint's instance type (one GPU instance).")
    ] = DEFAULT_INSTANCE_TYPE,
    image: Annotated[
        str | None,
        typer.Option(help="sagemaker: a vLLM serving image for SageMaker other than AWS's."),
    ] = None,
    wait_minutes: Annotated[
        float, typer.Option(min=1.0, help="Wait this long, then say how to go on.")
    ] = WAIT_SECONDS / 60,
    prefix: Prefix = None,
    profile: Profile = None,
    region: Region = None,
    as_json: AsJson = False,
) -> None:
    """Deploy a run's registered model: a Nova model on Bedrock, an open-weights model on a
    SageMaker endpoint."""
    session, deployment = deployed(prefix, profile, region)
    clients = {name: session.client(name) for name in ("s3", "bedrock", "sagemaker")}
    waiting = Waiting(limit_seconds=wait_minutes * 60)

    def progress(line: str) -> None:
        err.print(line, markup=False, highlight=False)

    def work() -> tuple[dict[str, Any], str]:
        target = to or Target(target_of(clients["s3"], deployment, run_id))
        if delete:
            deleted = (
                delete_from_bedrock(clients["bedrock"], deployment, run_id)
                if target is Target.bedrock
                else delete_from_sagemaker(clients["sagemaker"], deployment, run_id)
            )
            return {"deleted": deleted}, (
                "deleted: " + ", ".join(deleted) if deleted else "nothing to delete"
            )
        if target is Target.sagemaker:
            endpoint = deploy_to_sagemaker(
                clients, deployment, run_id, instance_type=instance_type, image=image,
                waiting=waiting, on_progress=progress,
            )  # fmt: skip
            return asdict(endpoint), (
                f"run {run_id} deployed on SageMaker: endpoint {endpoint.endpoint_name} "
                f'({endpoint.instance_type}), serving model "{endpoint.served_model}"\n'
                f"invoke: aws sagemaker-runtime invoke-endpoint --endpoint-name "
                f"{endpoint.endpoint_name} --content-type application/json "
                "--cli-binary-format raw-in-base64-out --body "
                f'\'{{"model": "{endpoint.served_model}", "messages": [{{"role": '
                '"user", "content": "Hello"}]}\' answer.json\n'
                f"registered {endpoint.model_package_arn}\n"
                f"it costs while it runs: `mtrl deploy {run_id} --to sagemaker --delete`"
            )
        released = deploy_to_bedrock(
            clients, deployment, run_id, waiting=waiting, on_progress=progress
        )
        return asdict(released), (
            f"run {run_id} deployed on Bedrock: invoke {released.deployment_arn}\n"
            f"custom model {released.model_arn}\nregistered {released.model_package_arn}"
        )

    apply_change(work, refusals=(DeployRefused, DeployFailed), as_json=as_json)
