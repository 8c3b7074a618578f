"""The Forge HyperPod CLI bundle a deployment pins (`forge_cli_bundle`), fetched with the
deployer's credentials into the launcher image's build context before `cdk deploy` (`make deploy`
runs `mtrl forge-cli`); nothing fetches it at run time.

AWS's instructions to Forge customers (aws/nova-forge-sdk's README, "For Forge Customers") copy
the bundle's S3 folder recursively; so does this, into a folder of its own first. A bundle that
does not hash to the pinned digest never replaces the one in place; with no digest pinned yet,
the bundle is put in place for review and its digest printed, and synth refuses to build it until
the digest is pinned (stacks/components/nova_launcher.py).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from domain.bucket import KeyOutsideFolder, download_folder
from stacks.components.nova_launcher import FORGE_CLI_BUNDLE, bundle_digest
from stacks.components.project_files import PROJECT_ROOT
from stacks.config import ForgeCliBundle

# Where a fetch downloads before its bundle is checked (beside the bundle, ignored by git).
STAGING = f"{FORGE_CLI_BUNDLE.rpartition('/')[0]}/.fetching"
_DENIED = ("AccessDenied", "403", "Forbidden")
_MISSING = ("NoSuchBucket", "NoSuchKey", "404")


class ForgeCliError(RuntimeError):
    """The bundle cannot be fetched or is not the pinned one; the text says why and the fix."""


@dataclass(frozen=True)
class FetchedBundle:
    folder: Path
    files: int
    digest: str
    pinned: bool  # the digest is the deployment's pin (False: none pinned yet)


def fetch_forge_cli(s3: Any, bundle: ForgeCliBundle, *, root: Path = PROJECT_ROOT) -> FetchedBundle:
    """Download every object under the bundle's folder, check it, and put it in place."""
    staging, target = root / STAGING, root / FORGE_CLI_BUNDLE
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        files = _download(s3, bundle, staging)
        digest = bundle_digest(staging)
        if bundle.sha256 is not None and digest != bundle.sha256:
            raise ForgeCliError(
                f"{bundle.uri} has digest {digest}, not the pinned {bundle.sha256}: AWS may "
                "have published a new bundle; review it (fetch with forge_cli_bundle.sha256 "
                "unset) before pinning its digest. The bundle in place is unchanged"
            )
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return FetchedBundle(target, files, digest, pinned=bundle.sha256 is not None)


def _download(s3: Any, bundle: ForgeCliBundle, into: Path) -> int:
    try:
        download_folder(s3, bundle.uri, into)
    except ClientError as error:
        raise _refused(bundle, error) from None
    except KeyOutsideFolder as outside:
        raise ForgeCliError(str(outside)) from None
    except LookupError:
        raise ForgeCliError(
            f"{bundle.uri} holds no files: check forge_cli_bundle.uri against the bundle's folder "
            "in aws/nova-forge-sdk's README"
        ) from None
    return sum(1 for path in into.rglob("*") if path.is_file())


def _refused(bundle: ForgeCliBundle, error: ClientError) -> ForgeCliError:
    code = error.response.get("Error", {}).get("Code", "")
    if code in _DENIED:
        return ForgeCliError(
            f"access denied to {bundle.uri}: the bundle is for Nova Forge subscribers; subscribe "
            "the account (SageMaker AI console, Nova Forge) and use its credentials"
        )
    if code in _MISSING:
        return ForgeCliError(f"{bundle.uri} does not exist: check forge_cli_bundle.uri")
    return ForgeCliError(f"fetching {bundle.uri} failed: {code}")
