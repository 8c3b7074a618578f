"""Where a deployment lives, read from its CloudFormation stack outputs — never hand-copied ARNs.

`find_deployment(session, prefix)` describes the stacks `<prefix>-storage`, `<prefix>-pipeline`
and `<prefix>-compute` in the session's region and collects their outputs. Everything that can
go wrong on the way (no credentials, no region, a stack missing or unfinished, an output absent)
is a `DeploymentError` whose message is one line saying what to do; `missing_prerequisites`
names the region and credentials a session lacks before anything is called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import boto3
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    NoRegionError,
    ProfileNotFound,
)

from domain.naming import OUTPUT_STACKS, StackOutput, stack_name
from domain.runs import execution_arn

# Stack states in which the outputs are those of a finished deployment.
USABLE = {"CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE", "IMPORT_COMPLETE"}


class DeploymentError(RuntimeError):
    """The deployment cannot be found or used; the message is the one line to show."""


@dataclass(frozen=True)
class Deployment:
    prefix: str
    region: str
    account: str
    outputs: dict[str, str]

    def output(self, key: str) -> str:
        try:
            return self.outputs[key]
        except KeyError:
            raise DeploymentError(
                f"deployment {self.prefix} in {self.region} has no output {key}: "
                "redeploy with this version (make deploy)"
            ) from None

    @property
    def data_bucket(self) -> str:
        return self.output(StackOutput.DATA_BUCKET_NAME)

    @property
    def state_machine_arn(self) -> str:
        return self.output(StackOutput.STATE_MACHINE_ARN)

    @property
    def runs_table(self) -> str:
        return self.output(StackOutput.RUNS_TABLE_NAME)

    def execution_arn(self, run_id: str) -> str:
        return execution_arn(self.state_machine_arn, run_id)

    def execution_console_url(self, run_id: str) -> str:
        return (
            f"https://{self.region}.console.aws.amazon.com/states/home?region={self.region}"
            f"#/v2/executions/details/{self.execution_arn(run_id)}"
        )


NO_REGION = "no AWS region: pass --region, set AWS_REGION, or configure one for the profile"
NO_CREDENTIALS = "no AWS credentials: run `aws configure` (or `aws sso login`), or pass --profile"


def aws_session(*, profile: str | None, region: str | None) -> boto3.Session:
    """A session for `--profile` / `--region` (else the usual AWS environment and config)."""
    try:
        return boto3.Session(profile_name=profile, region_name=region)
    except ProfileNotFound:
        raise DeploymentError(
            f"AWS profile {profile!r} is not configured: run `aws configure --profile {profile}` "
            "or pick one from ~/.aws/config"
        ) from None


def missing_prerequisites(session: boto3.Session) -> list[str]:
    """What the session lacks before any call can be made (region, credentials), all at once so
    that a newcomer fixes them in one round; found without calling AWS."""
    missing = [] if session.region_name else [NO_REGION]
    if session.get_credentials() is None:
        missing.append(NO_CREDENTIALS)
    return missing


def find_deployment(session: boto3.Session, prefix: str) -> Deployment:
    """The deployment `<prefix>` in the session's region, from its stacks' outputs."""
    cloudformation = session.client("cloudformation")
    region = session.region_name
    outputs: dict[str, str] = {}
    account = ""
    for part in OUTPUT_STACKS:
        name = stack_name(prefix, part)
        stack = _describe(cloudformation, name, region)
        if stack["StackStatus"] not in USABLE:
            raise DeploymentError(
                f"stack {name} in {region} is {stack['StackStatus']}: wait for it or fix it in "
                "the CloudFormation console, then try again"
            )
        account = stack["StackId"].split(":")[4]
        outputs |= {item["OutputKey"]: item["OutputValue"] for item in stack.get("Outputs", [])}
    return Deployment(prefix=prefix, region=region, account=account, outputs=outputs)


def _describe(cloudformation: Any, name: str, region: str) -> dict[str, Any]:
    try:
        return cloudformation.describe_stacks(StackName=name)["Stacks"][0]
    except NoCredentialsError:
        raise DeploymentError(NO_CREDENTIALS) from None
    except NoRegionError:
        raise DeploymentError(NO_REGION) from None
    except ClientError as error:
        code = error.response["Error"]["Code"]
        message = error.response["Error"].get("Message", "")
        if code == "ValidationError" and "does not exist" in message:
            raise DeploymentError(
                f"stack {name} not found in {region}: deploy with `make deploy`, or pass the "
                "--region (and --prefix) it was deployed with"
            ) from None
        if code in ("ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId"):
            raise DeploymentError(
                f"AWS credentials rejected ({code}): refresh them (`aws sso login`) or pass --profile"
            ) from None
        raise DeploymentError(f"cannot read stack {name} in {region}: {code}: {message}") from None
    except BotoCoreError as error:
        raise DeploymentError(f"cannot reach CloudFormation in {region}: {error}") from None
