"""The Forge HyperPod CLI bundle: fetched with the deployer's credentials, put in place only when
it is the pinned one, and built into the launcher image only then."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from typer.testing import CliRunner

from mtrl.cli import app
from mtrl.ops.forge_cli import ForgeCliError, fetch_forge_cli
from stacks.components.nova_launcher import FORGE_CLI_BUNDLE, bundle_digest, checked_bundle
from stacks.config import ConfigError, ForgeCliBundle, PlatformConfig

# The folder aws/nova-forge-sdk's README copies the bundle from ("For Forge Customers").
URI = "s3://nova-forge-c7363-206080352451-us-east-1/v1/"
BUCKET = "nova-forge-c7363-206080352451-us-east-1"
FILES = {
    "setup.py": b"from setuptools import setup\nsetup(name='hyperpod')\n",
    "src/hyperpod_cli/__init__.py": b"",
    "src/hyperpod_cli/sagemaker_hyperpod_recipes/launcher/nova/constants.py": b"MAP = {}\n",
    "README md with space.txt": b"spaces survive\n",
}


def publish(files: dict[str, bytes], prefix: str = "v1/") -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    for name, body in files.items():
        s3.put_object(Bucket=BUCKET, Key=prefix + name, Body=body)


def digest_of(files: dict[str, bytes], tmp_path: Path) -> str:
    folder = tmp_path / "expected"
    for name, body in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(body)
    return bundle_digest(folder)


def test_the_digest_is_the_one_sha256sum_gives(tmp_path: Path) -> None:
    """The command the docstring gives, run with the real coreutils, is the oracle."""
    digest = digest_of(FILES, tmp_path)
    by_hand = subprocess.run(
        "find . -type f -printf '%P\\n' | LC_ALL=C sort | xargs -d '\\n' sha256sum | sha256sum",
        shell=True, cwd=tmp_path / "expected", capture_output=True, text=True, check=True,
    ).stdout.split()[0]  # fmt: skip
    assert digest == by_hand
    (tmp_path / "expected" / "setup.py").write_bytes(b"changed")
    assert bundle_digest(tmp_path / "expected") != digest


def test_a_fetch_without_a_pin_puts_the_bundle_in_place_for_review(aws, tmp_path: Path) -> None:
    publish({**FILES, "docs/": b""})  # a console folder marker is no file
    fetched = fetch_forge_cli(boto3.client("s3"), ForgeCliBundle(uri=URI), root=tmp_path)
    assert (fetched.files, fetched.pinned) == (len(FILES), False)
    assert fetched.folder == tmp_path / FORGE_CLI_BUNDLE
    for name, body in FILES.items():
        assert (fetched.folder / name).read_bytes() == body
    assert fetched.digest == digest_of(FILES, tmp_path) == bundle_digest(fetched.folder)


def test_the_pinned_bundle_replaces_the_one_in_place_and_another_never_does(
    aws, tmp_path: Path
) -> None:
    publish(FILES)
    pinned = ForgeCliBundle(uri=URI, sha256=digest_of(FILES, tmp_path))
    fetched = fetch_forge_cli(boto3.client("s3"), pinned, root=tmp_path)
    assert fetched.pinned and checked_bundle(pinned, root=tmp_path) == "forge"

    boto3.client("s3").put_object(Bucket=BUCKET, Key="v1/setup.py", Body=b"a new release")
    with pytest.raises(ForgeCliError) as refused:
        fetch_forge_cli(boto3.client("s3"), pinned, root=tmp_path)
    assert str(refused.value).startswith(f"{URI} has digest ")
    assert f"not the pinned {pinned.sha256}" in str(refused.value)
    assert (tmp_path / FORGE_CLI_BUNDLE / "setup.py").read_bytes() == FILES["setup.py"]
    assert checked_bundle(pinned, root=tmp_path) == "forge"
    assert not (tmp_path / FORGE_CLI_BUNDLE).with_name(".fetching").exists()


def test_a_key_leading_outside_the_bundle_fetches_nothing(aws, tmp_path: Path) -> None:
    publish({"setup.py": b"x", "../../../outside.py": b"y"})
    with pytest.raises(ForgeCliError, match="is not a plain path under s3://"):
        fetch_forge_cli(boto3.client("s3"), ForgeCliBundle(uri=URI), root=tmp_path)
    assert not (tmp_path / FORGE_CLI_BUNDLE).exists()
    assert not list(tmp_path.rglob("outside.py"))


def test_an_empty_or_missing_folder_says_to_check_the_uri(aws, tmp_path: Path) -> None:
    publish(FILES)
    with pytest.raises(ForgeCliError, match="holds no files: check forge_cli_bundle.uri"):
        fetch_forge_cli(boto3.client("s3"), ForgeCliBundle(uri=f"{URI}v9/"), root=tmp_path)
    missing = ForgeCliBundle(uri="s3://no-such-forge-bucket/v1/")
    with pytest.raises(ForgeCliError, match="does not exist: check forge_cli_bundle.uri"):
        fetch_forge_cli(boto3.client("s3"), missing, root=tmp_path)


def test_a_denied_listing_says_the_bundle_is_for_forge_subscribers(tmp_path: Path) -> None:
    s3 = boto3.client(
        "s3", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="s"
    )
    with Stubber(s3) as stub:
        stub.add_client_error(
            "list_objects_v2", service_error_code="AccessDenied", http_status_code=403,
            expected_params={"Bucket": BUCKET, "Prefix": "v1/"},
        )  # fmt: skip
        with pytest.raises(ForgeCliError) as denied:
            fetch_forge_cli(s3, ForgeCliBundle(uri=URI), root=tmp_path)
    assert str(denied.value) == (
        f"access denied to {URI}: the bundle is for Nova Forge subscribers; subscribe the "
        "account (SageMaker AI console, Nova Forge) and use its credentials"
    )


def test_synth_builds_the_forge_bundle_only_once_fetched_and_pinned(tmp_path: Path) -> None:
    assert checked_bundle(None, root=tmp_path) == "public"
    unpinned = ForgeCliBundle(uri=URI)
    with pytest.raises(
        ConfigError,
        match=r"forge_cli_bundle has no sha256: run `mtrl forge-cli` \(make deploy runs it",
    ):
        checked_bundle(unpinned, root=tmp_path)
    pinned = ForgeCliBundle(uri=URI, sha256=hashlib.sha256(b"x").hexdigest())
    with pytest.raises(
        ConfigError, match=f"no bundle in {FORGE_CLI_BUNDLE}: run `mtrl forge-cli` \\(make deploy"
    ):
        checked_bundle(pinned, root=tmp_path)
    (tmp_path / FORGE_CLI_BUNDLE).mkdir(parents=True)
    (tmp_path / FORGE_CLI_BUNDLE / "setup.py").write_bytes(b"y")
    with pytest.raises(ConfigError, match="has digest [0-9a-f]{64}, not the pinned"):
        checked_bundle(pinned, root=tmp_path)


def test_the_setting_takes_an_s3_folder_and_a_sha256() -> None:
    config = PlatformConfig.from_context({"forge_cli_bundle": json.dumps({"uri": URI})})
    assert config.forge_cli_bundle == ForgeCliBundle(uri=URI)
    for bad in ({"uri": "https://example.com/v1/"}, {"uri": URI, "sha256": "abc"}):
        with pytest.raises(ConfigError, match="forge_cli_bundle"):
            PlatformConfig.from_context({"forge_cli_bundle": bad})


def test_the_command_does_nothing_without_a_bundle_configured() -> None:
    result = CliRunner().invoke(app, ["forge-cli"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "no forge_cli_bundle configured: the launcher builds the public release_v2" in (
        result.output
    )
