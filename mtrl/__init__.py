"""nova-mtrl's command line (`mtrl`) and local mode."""

import os

__version__ = "0.1.0"

# jsii (the CDK's Python runtime, which `mtrl` loads for the deployment's settings and local
# mode's synth) prints Node 20's end-of-life banner on every start; `make` and app.py silence it
# the same way. Set before anything imports aws_cdk.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
