"""Lambda code for the pipeline's functions, packaged without Docker.

The asset holds our `lambdas`, `domain` and `training_configs` packages plus their few
third-party requirements, installed by pip for the Lambda platform (manylinux x86_64, CPython
3.12) on the deploying machine. Docker is only the fallback CDK uses when local bundling is impossible.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import jsii
from aws_cdk import aws_lambda as lambda_

from stacks.components.project_files import PROJECT_ROOT, only_folders, pinned

PACKAGES = ("lambdas", "domain", "training_configs")
# boto3 comes with the Lambda runtime; the rest at pyproject.toml's pins.
REQUIREMENTS = pinned("pydantic", "pyyaml", "numpy", "aws-lambda-powertools")
# Lambda's Python 3.12 runtime runs on Amazon Linux 2023 (glibc 2.34): wheels built for
# manylinux_2_28 (numpy 2.4's only ones) or older (manylinux2014, as pydantic-core's) both load.
PLATFORMS = ("--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64")
RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = lambda_.Architecture.X86_64
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


@jsii.implements(cdk.ILocalBundling)
class PipBundling:
    """Installs the requirements with pip for the Lambda platform and copies our packages."""

    def try_bundle(self, output_dir: str, _options: Any = None) -> bool:
        subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "--quiet", "--no-compile",
                "--no-warn-conflicts", "--target", output_dir,
                *PLATFORMS, "--implementation", "cp",
                "--python-version", "3.12", "--only-binary=:all:",
                *REQUIREMENTS,
            ],
            check=True,
        )  # fmt: skip
        for package in PACKAGES:
            shutil.copytree(PROJECT_ROOT / package, Path(output_dir) / package, ignore=_IGNORED)
        return True


def pipeline_code() -> lambda_.Code:
    """One asset for every pipeline Lambda (handlers differ by module path)."""
    return lambda_.Code.from_asset(
        str(PROJECT_ROOT),
        exclude=only_folders(PACKAGES),
        bundling=cdk.BundlingOptions(
            image=RUNTIME.bundling_image,
            local=PipBundling(),
            command=[
                "bash",
                "-c",
                f"pip install --no-compile -t /asset-output {' '.join(REQUIREMENTS)} && "
                f"cp -r {' '.join(PACKAGES)} /asset-output/",
            ],
        ),  # fmt: skip
    )
