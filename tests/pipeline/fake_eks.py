"""EKS Pod Identity associations, recorded (moto has none): every request is checked against
the EKS API model as boto3 would send it, so a wrong parameter fails here as it would on AWS."""

from __future__ import annotations

import itertools
from typing import Any

import boto3
from botocore.validate import validate_parameters


class FakeEks:
    def __init__(self) -> None:
        self.meta = boto3.client("eks", region_name="us-east-1").meta
        self.associations: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._ids = itertools.count(1)

    def _record(self, operation: str, params: dict[str, Any]) -> None:
        shape = self.meta.service_model.operation_model(operation).input_shape
        validate_parameters(params, shape)
        self.requests.append((operation, params))

    def create_pod_identity_association(self, **params: Any) -> dict[str, Any]:
        self._record("CreatePodIdentityAssociation", params)
        association = {
            "associationId": f"a-{next(self._ids):017d}",
            **{
                key: params[key]
                for key in ("clusterName", "namespace", "serviceAccount", "roleArn")
            },
        }
        self.associations[association["associationId"]] = association
        return {"association": association}

    def delete_pod_identity_association(self, **params: Any) -> dict[str, Any]:
        self._record("DeletePodIdentityAssociation", params)
        return {"association": self.associations.pop(params["associationId"])}

    def get_paginator(self, name: str) -> Any:
        assert name == "list_pod_identity_associations"
        fake = self

        class Pages:
            def paginate(self, **params: Any) -> list[dict[str, Any]]:
                fake._record("ListPodIdentityAssociations", params)
                found = [
                    a for a in fake.associations.values()
                    if a["clusterName"] == params["clusterName"]
                    and a["namespace"] == params.get("namespace", a["namespace"])
                ]  # fmt: skip
                return [{"associations": found}]

        return Pages()
