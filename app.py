#!/usr/bin/env python3
"""The CDK app of nova-mtrl: `cdk synth` / `cdk deploy` run this file (see cdk.json)."""

import os
import sys

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from stacks.config import ConfigError, PlatformConfig, deployment_context  # noqa: E402


def main() -> int:
    try:
        # Checked before the CDK loads (seconds of Node.js): a bad value fails at once.
        config = PlatformConfig.from_context(deployment_context())
    except ConfigError as error:
        print(f"nova-mtrl: {error}", file=sys.stderr)
        return 1
    if config.nova_notice:
        print(f"nova-mtrl: {config.nova_notice}", file=sys.stderr)
    from stacks.app_builder import build_app

    app, _ = build_app()
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
