"""A gated Hugging Face model's access token (Llama, Mistral, Gemma, …), read when the trainer
starts from the Secrets Manager secret the deployment's preset names (`hub_token_secret`); the
trainer makes it HF_TOKEN, where transformers, huggingface_hub and vLLM look. The run's
configuration (a ConfigMap) carries only the secret's name; the token is never logged.

The secret's value is the token, or — as the console's key/value secrets are stored — a JSON
object with an `HF_TOKEN` key or a single key.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from llm_trainer.model import ModelNotLoaded

KEY = "HF_TOKEN"
_FIXES = {
    "ResourceNotFoundException": "create it in the deployment's region: aws secretsmanager "
    "create-secret --name {secret} --secret-string <your hf_… token>",
    "AccessDeniedException": "the run's pods read only the secrets the deployment's "
    "model_presets name (hub_token_secret): name it there and cdk deploy",
    "DecryptionFailure": "the secret's KMS key does not let the pods decrypt it: keep the "
    "default key (aws/secretsmanager)",
}


def hub_token(secret: str, secrets: Any) -> str:
    """The token in `secret` (a Secrets Manager client's GetSecretValue); ModelNotLoaded says
    why not and what to do."""
    try:
        answer = secrets.get_secret_value(SecretId=secret)
    except ClientError as error:
        raise _unreadable(secret, error.response["Error"]["Code"]) from None
    except BotoCoreError as error:  # no answer at all: the endpoint, the credentials, …
        raise _unreadable(secret, type(error).__name__) from None
    return _token(secret, answer.get("SecretString") or "")


def _unreadable(secret: str, code: str) -> ModelNotLoaded:
    fix = _FIXES.get(code, "check the secret in the deployment's region").format(secret=secret)
    return ModelNotLoaded(
        f"the Hugging Face token's secret {secret!r} cannot be read ({code}): {fix}"
    )


def _token(secret: str, value: str) -> str:
    value = value.strip()
    if value.startswith("{"):
        try:
            pairs = json.loads(value)
        except json.JSONDecodeError:
            pairs = None
        if not isinstance(pairs, dict):
            raise ModelNotLoaded(f"secret {secret!r} is not a JSON object or a token")
        if KEY in pairs:
            value = pairs[KEY]
        elif len(pairs) == 1:
            (value,) = pairs.values()
        else:
            raise ModelNotLoaded(
                f"secret {secret!r} has keys {sorted(pairs)}: name the token's key {KEY}"
            )
    if not isinstance(value, str) or not value.strip():
        raise ModelNotLoaded(
            f"secret {secret!r} holds no token: put the Hugging Face access token in it"
        )
    return value.strip()
