"""A ValidatingAdmissionPolicy's verdict on one request, its CEL evaluated by cel-python (the CEL
specification's Python implementation; Kubernetes adds libraries these policies do not use):
match conditions, then variables in order, then every validation."""

from __future__ import annotations

from typing import Any

import celpy


def verdict(policy: dict[str, Any], *, groups: list[str], obj: dict[str, Any]) -> str | None:
    """None when the policy admits the request (or does not apply to it); else its message."""
    spec, environment = policy["spec"], celpy.Environment()

    def evaluate(expression: str, activation: dict[str, Any]) -> Any:
        return environment.program(environment.compile(expression)).evaluate(activation)

    request = {"userInfo": {"groups": groups}}
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(obj),
    }
    if not all(evaluate(c["expression"], activation) for c in spec.get("matchConditions", [])):
        return None
    variables = celpy.celtypes.MapType()
    for variable in spec.get("variables", []):
        activation["variables"] = variables
        value = evaluate(variable["expression"], activation)
        variables = celpy.celtypes.MapType(
            {**variables, celpy.celtypes.StringType(variable["name"]): value}
        )
    activation["variables"] = variables
    for validation in spec["validations"]:
        if not evaluate(validation["expression"], activation):
            return validation["message"]
    return None
