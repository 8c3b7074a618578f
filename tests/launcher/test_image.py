"""The launcher image (stacks/assets/launcher/Dockerfile) against what the code expects of it: it
cannot be built here (no Docker engine), so its facts are pinned one by one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from domain.nova_job import FORGE_RECIPES, LAUNCHER_RECIPES, evaluation_run_recipe, run_recipe
from lambdas.launcher import handler
from lambdas.launcher.handler import LauncherSettings
from stacks.components.lambda_code import PACKAGES
from stacks.components.nova_launcher import DOCKERFILE, FORGE_CLI_BUNDLE, HANDLER
from stacks.components.project_files import PROJECT_ROOT
from stacks.config import ConfigError
from tests.conftest import Synthesized, synthesize

TEXT = (PROJECT_ROOT / DOCKERFILE).read_text()
ENV = dict(re.findall(r"^ENV (\w+)=(\S+)$", TEXT, re.MULTILINE))
ARGS = dict(re.findall(r"^ARG (\w+)=(\S+)$", TEXT, re.MULTILINE))


def test_it_runs_the_launcher_handler() -> None:
    assert f'CMD ["{HANDLER}"]' in TEXT
    module, name = HANDLER.rsplit(".", 1)
    assert module == handler.__name__ and callable(getattr(handler, name))
    copied = re.findall(r"^COPY (\w+) \$\{LAMBDA_TASK_ROOT\}/(\w+)$", TEXT, re.MULTILINE)
    assert sorted(copied) == sorted((package, package) for package in PACKAGES)


def test_it_sets_what_the_handler_reads_from_it() -> None:
    fields = LauncherSettings.model_fields
    for field in ("recipes", "nemo_launcher"):
        assert fields[field].alias in ENV
    assert ENV["NEMO_LAUNCHER_SCRIPTS"].startswith(
        ENV["HYPERPOD_RECIPES"].split("/recipes_collection/")[0]
    )


def test_a_runs_recipes_land_in_the_writable_folders_the_image_links() -> None:
    """The links are the Forge folders of the CLI's recipes collection, for training and for
    evaluation; every run recipe is under one; their targets are apart, under the handler's
    default working directory, in /tmp."""
    links = dict(
        (folder, link)
        for link, folder in re.findall(r'ln -s (\S+) "\$\{HYPERPOD_RECIPES\}/(\S+)"', TEXT)
    )
    assert sorted(links) == ["evaluation/nova/forge", "fine-tuning/nova/forge"]
    recipes = [run_recipe(recipe, "n") for recipe in FORGE_RECIPES]
    assert all(recipe.startswith("fine-tuning/nova/forge/") for recipe in recipes)
    assert evaluation_run_recipe("n").startswith("evaluation/nova/forge/")
    workdir = LauncherSettings.model_fields["workdir"].default
    assert {Path(link).parent for link in links.values()} == {workdir}
    assert len(set(links.values())) == 2 and str(workdir).startswith("/tmp/")


def test_aws_tools_are_pinned() -> None:
    """aws/sagemaker-hyperpod-cli release_v2 at abcdc77 (the branch's head, 2026-06): its recipes
    submodule is aws/sagemaker-hyperpod-recipes 0700d22 ("Release 2.0.0"), whose launcher keeps
    47 characters of a run's name (domain/nova_job.py keeps names within 34, as newer ones do)."""
    assert ARGS["HYPERPOD_CLI_COMMIT"] == "abcdc77b3e4ca160874021c6615baf0dbb96c69b"
    # `git ls-tree abcdc77 src/hyperpod_cli/` in aws/sagemaker-hyperpod-cli: the recipes
    # submodule at 0700d223f2718fad2d4b0cf0d761b0c5a321aa58 — whose images and regions
    # domain/nova_job.py takes (a new CLI pin fails here until LAUNCHER_RECIPES moves with it).
    submodules = {
        "abcdc77b3e4ca160874021c6615baf0dbb96c69b": "0700d223f2718fad2d4b0cf0d761b0c5a321aa58"
    }
    assert submodules[ARGS["HYPERPOD_CLI_COMMIT"]].startswith(LAUNCHER_RECIPES)
    assert re.fullmatch(r"v3\.\d+\.\d+", ARGS["HELM_VERSION"])  # helm 4 lists differently
    assert "sha256sum -c" in TEXT


def test_the_forge_bundle_is_built_from_where_the_fetch_puts_it() -> None:
    """Build argument HYPERPOD_CLI picks the CLI (public by default); the forge one is the
    bundle `mtrl forge-cli` fetched, copied from the build context, with NVIDIA's NeMo launcher
    at the commit aws/sagemaker-hyperpod-recipes 0700d22 pins (`git ls-tree 0700d22
    launcher/nemo/`: nemo_framework_launcher at 3d41c31c91d5a47a84ad15cbf783c56700c30521)."""
    assert ARGS["HYPERPOD_CLI"] == "public"
    assert ARGS["NEMO_LAUNCHER_COMMIT"] == "3d41c31c91d5a47a84ad15cbf783c56700c30521"
    (copied,) = re.findall(r"^COPY (\S+) /opt/forge-cli$", TEXT, re.MULTILINE)
    assert f"{copied}/bundle" == FORGE_CLI_BUNDLE
    assert "mv /opt/forge-cli/bundle /opt/hyperpod-cli" in TEXT
    nemo = ENV["NEMO_LAUNCHER_SCRIPTS"].removesuffix("/nemo_framework_launcher/launcher_scripts")
    assert f"nemo={nemo}" in TEXT  # where the Forge SDK's README clones it


def _launcher_build_args(app: Synthesized) -> dict[str, str]:
    (manifest,) = app.outdir.glob("*pipeline.assets.json")
    images = json.loads(manifest.read_text())["dockerImages"].values()
    (launcher,) = [i for i in images if i["source"].get("dockerFile") == DOCKERFILE]
    return launcher["source"]["dockerBuildArgs"]


def test_a_deployment_builds_the_public_cli_unless_it_pins_a_bundle(
    default_app: Synthesized, tmp_path: Path
) -> None:
    assert _launcher_build_args(default_app)["HYPERPOD_CLI"] == "public"
    pinned = {"uri": "s3://nova-forge-example/v1/", "sha256": "0" * 64}
    with pytest.raises(
        ConfigError, match=r"forge_cli_bundle: .*run `mtrl forge-cli` \(make deploy runs it"
    ):
        synthesize({"forge_cli_bundle": pinned}, tmp_path)
