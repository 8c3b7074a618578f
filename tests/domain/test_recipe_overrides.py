"""Overrides as the Forge SDK applies them, with the SDK's own code as the oracle.

The installed amzn-nova-forge 1.4.10 cannot be imported here (its package needs Python 3.12 and
the SageMaker SDK), but the functions that build a recipe are self-contained: this file compiles
them from the wheel's source as they are, and runs them —
- `RecipeBuilder._build_final_recipe` (recipe/recipe_builder.py): the recipe after an overrides
  template ({leaf key: {"default": value}});
- `_build_rft_overrides_from_recipe` (util/recipe.py): the template the SDK makes of a multi-turn
  recipe (every leaf, the last of a name winning), which `load_recipe_templates` then fills with
  the run's BYOO endpoints where the template has them, and `_resolve_user_inputs` with the
  run's settings;
with the SDK's own enums (core/enums.py, which imports nothing of the SDK).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from importlib.metadata import distribution
from typing import Any, Dict  # noqa: UP035 (the SDK's source names them)

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from domain.nova_job import BYOO_KEYS, apply_overrides, recipe_overrides
from tests.forge_recipe import DOCUMENTED_BYOO_RECIPE, forge_recipe
from tests.forge_sdk import sdk_compiled, sdk_enums, sdk_path, sdk_source
from training_configs.schema import SHIPPED, load_training_config

BYOO = {key: f"<{key}>" for key in BYOO_KEYS}


@functools.cache
def _sdk_function(path: str, name: str) -> Callable[..., Any]:
    """The SDK's function (or method) `name` of `path`, compiled from its source as it is."""
    names = {"Any": Any, "Dict": Dict, "TrainingMethod": sdk_enums().TrainingMethod}  # noqa: UP006
    return sdk_compiled(path, name, names)


def sdk_build_final_recipe(recipe: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    build = _sdk_function("recipe/recipe_builder.py", "_build_final_recipe")
    return build(None, recipe_template=copy.deepcopy(recipe), overrides_template=template)


def sdk_multiturn_recipe(recipe_text: str, method: str, overrides: dict[str, Any]) -> Any:
    """The recipe the SDK builds for an RFT multi-turn run with these leaf overrides: its
    template of the recipe, the overrides as its defaults, then `_build_final_recipe`."""
    make_template = _sdk_function("util/recipe.py", "_build_rft_overrides_from_recipe")
    template = make_template(recipe_text, sdk_enums().TrainingMethod[method])
    for key, value in overrides.items():
        template.setdefault(key, {})["default"] = value
    return sdk_build_final_recipe(yaml.safe_load(recipe_text), template)


def test_the_oracle_is_the_sdks_code() -> None:
    """The functions run are the wheel's: their source names the SDK's own edge cases."""
    source = sdk_source("recipe/recipe_builder.py")
    assert 'if key == "name" and value == "distributed_fused_adam":' in source
    assert _sdk_function(
        "recipe/recipe_builder.py", "_build_final_recipe"
    ).__code__.co_filename == (str(sdk_path("recipe/recipe_builder.py")))
    assert distribution("amzn-nova-forge").version == "1.4.10"


def test_the_documented_byoo_recipe_is_built_as_the_sdk_builds_it_for_both_shipped_configs() -> (
    None
):
    """The user guide's recipe, the Forge LoRA stand-in, and each shipped config's overrides:
    ours equals the SDK's whole multi-turn path (its template of the recipe, whose every
    duplicated leaf name — replicas, max_steps, global_batch_size, timeout — the run sets)."""
    text = DOCUMENTED_BYOO_RECIPE.read_text(encoding="utf-8")
    for name in SHIPPED:
        config = load_training_config(name)
        overrides = recipe_overrides(
            config, name="n", data_s3_path="s3://b/d", output_s3_path="s3://b/o/", byoo=BYOO
        )
        ours = apply_overrides(yaml.safe_load(text), overrides).recipe
        assert ours == sdk_multiturn_recipe(text, config.recipe, overrides), name
        stand_in = forge_recipe(config.recipe)
        template = {key: {"default": value} for key, value in overrides.items()}
        assert apply_overrides(stand_in, overrides).recipe == sdk_build_final_recipe(
            stand_in, template
        )


KEYS = st.sampled_from(
    ["name", "temperature", "timeout", "lr", "replicas", "enabled", "preprocessing",
     "postprocessing", "max_steps", "delegate", "alpha"]
)  # fmt: skip
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=False, width=32),
    st.sampled_from(["distributed_fused_adam", "${run.replicas}", "", "adam"]),
    st.lists(st.integers(0, 3), max_size=2),
)
NODES = st.recursive(LEAVES, lambda inner: st.dictionaries(KEYS, inner, max_size=4), max_leaves=10)
RECIPES = st.dictionaries(KEYS, NODES, max_size=4)
OVERRIDES = st.dictionaries(KEYS, LEAVES, max_size=5)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(recipe=RECIPES, overrides=OVERRIDES)
@example(  # an optimizer's name is kept, the run's is set
    recipe={"run": {"name": "r"}, "optim": {"name": "distributed_fused_adam"}},
    overrides={"name": "n"},
)
@example(recipe={"generator": {"temperature": 1, "top_k": 0}}, overrides={"temperature": 0})
@example(recipe={"postprocessing": {"enabled": False}}, overrides={"postprocessing": True})
@example(  # a switched section is not walked, whether or not its own name is overridden
    recipe={"preprocessing": {"enabled": True, "lr": 1}, "lr": 2}, overrides={"lr": 3}
)
def test_any_recipe_and_overrides_build_as_the_sdk_builds_them(
    recipe: dict[str, Any], overrides: dict[str, Any]
) -> None:
    """Generated recipes with the names the SDK treats apart (an optimizer's `name`, an integer
    `temperature`, preprocessing/postprocessing sections, interpolations, lists): ours equals
    `_build_final_recipe`; a key is reported skipped exactly when setting it alone to a value
    no recipe holds changes nothing in the SDK's result."""
    template = {key: {"default": value} for key, value in overrides.items()}
    built = apply_overrides(recipe, overrides)
    # repr: 1, 1.0 and True are equal in Python, not in a recipe.
    assert repr(built.recipe) == repr(sdk_build_final_recipe(recipe, template))
    marker = "<not in any recipe>"
    assert built.skipped == tuple(
        key
        for key in overrides
        if repr(sdk_build_final_recipe(recipe, {key: {"default": marker}})) == repr(recipe)
    )
