# nova-mtrl — every target sets itself up: a fresh clone needs only python3 (and Node.js for CDK).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The open-weights trainer's libraries (PyTorch's CPU build, transformers, PEFT): the tests need
# them, `make demo` does not.
LLM_STAMP := $(VENV)/.installed-llm
# The CDK CLI used by deploy/destroy/diff; synth and test do not need it.
CDK_CLI_VERSION ?= 2.1148.1
CDK := npx --yes aws-cdk@$(CDK_CLI_VERSION)
SAGEMAKER_HYPERPOD_VERSION := 3.12.0
AMZN_NOVA_FORGE_VERSION := 1.4.10
SAGEMAKER_CORE_VERSION := 2.27.0
SAGEMAKER_TRAIN_VERSION := 1.27.0
UV_VERSION := 0.13.10
# Compiled at install, as pip does: a process never writes bytecode where PYTHONDONTWRITEBYTECODE
# is set, and would compile aws-cdk-lib's sources (287 MB) anew at every start.
UV_INSTALL := $(BIN)/uv pip install --compile-bytecode
UV_PIP := $(UV_INSTALL) --python $(BIN)/python
# The outside scanner a security reviewer runs over cdk.out, in a virtualenv of its own: its pins
# (boto3 1.35, policy_sentry 0.13) clash with ours.
CHECKOV_VERSION := 3.3.30
SCAN_VENV := .venv-scan
SCAN_STAMP := $(SCAN_VENV)/.checkov-$(CHECKOV_VERSION)
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20

.PHONY: help install demo test lint docs synth scan diff deploy destroy bench mutate clean

help:
	@echo "make demo     set up .venv if needed, train the Wordle example locally, offline (report in runs/)"
	@echo "make test     set up .venv if needed, lint, run the whole check suite (pytest, cfn-lint, cdk-nag), synth with bundling"
	@echo "make docs     build the documentation site offline into build/site/ (mkdocs, --strict)"
	@echo "make synth    write the CloudFormation templates to cdk.out/"
	@echo "make scan     synth, then checkov over cdk.out: fails on a finding not justified in its template"
	@echo "make deploy   cdk deploy --all (AWS credentials needed)   make destroy   make diff"
	@echo "make bench    measure synth and test times, environments and worker, router (bench/)"
	@echo "make mutate   mutation testing of the critical modules (bench/mutate.py; MODULES=... for some)"

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# uv installs the same pinned versions as pip, in about half pip's time.
	$(BIN)/python -m pip install --quiet uv==$(UV_VERSION)
	@echo "Installing nova-mtrl and its dependencies into $(VENV)"
	$(UV_PIP) -e '.[cdk,local,tracking,dev,docs]'
	# aws-cdk-lib and its dependency aws-cdk.cloud-assembly-schema both write
	# aws_cdk/cloud_assembly_schema/__init__.py; aws-cdk-lib's must win (pip installs it last,
	# uv in no set order): without it jsii cannot read a synthesized stack's messages.
	$(UV_PIP) --quiet --reinstall-package aws-cdk-lib -e '.[cdk,local,tracking,dev,docs]'
	# HyperPod's job model for the tests' schema check; its own pins clash with ours and the
	# module we load needs only pydantic, so it comes without dependencies.
	$(UV_PIP) --quiet --no-deps sagemaker-hyperpod==$(SAGEMAKER_HYPERPOD_VERSION)
	# AWS's dataset record model for the dataset's differential test: the package needs Python
	# 3.12 and the SageMaker SDK as a whole, the one module the test loads only pydantic.
	$(BIN)/python -m pip install --quiet --no-deps --ignore-requires-python amzn-nova-forge==$(AMZN_NOVA_FORGE_VERSION)
	# The SageMaker SDK's image registry data, for the serving image's test (a data file only),
	# its bearer token, and its managed multi-turn RL runtime contract (sagemaker/train/rft/):
	# oracles the tests load from source (tests/sagemaker_train_sdk.py); their pins clash with
	# ours. One at a time, in this order: each writes sagemaker/__init__.py, the last one stays.
	$(UV_PIP) --quiet --no-deps sagemaker-core==$(SAGEMAKER_CORE_VERSION)
	$(UV_PIP) --quiet --no-deps sagemaker-train==$(SAGEMAKER_TRAIN_VERSION)
	touch $(STAMP)

# pip, not uv, for PyTorch: pip follows the machine's pip configuration, which may offer its CPU
# build (CI's does); uv reads none of it and would download the multi-GB CUDA build.
$(LLM_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --progress-bar off -e '.[llm]'
	touch $(LLM_STAMP)

demo: install
	$(BIN)/mtrl local examples/wordle/train.jsonl --config examples/wordle/config.yaml --out runs

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint $(LLM_STAMP)
	$(BIN)/python -m pytest
	# The tests synthesize without Lambda bundling; deploy bundles. Do it once for real here, so a
	# requirement with no wheel for Lambda's platform fails the check, not the first deploy; then
	# scan what it wrote.
	$(MAKE) --no-print-directory scan

# The documentation site, offline (`make test` builds it too: tests/test_docs_site.py).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	@echo "open build/site/index.html"

synth: install
	rm -rf cdk.out
	CDK_OUTDIR=cdk.out $(BIN)/python app.py
	@ls cdk.out/*.template.json

# Every checkov finding is fixed or justified in its resource's metadata (stacks/components/scan.py):
# a finding without a reason fails.
scan: synth $(SCAN_STAMP)
	$(SCAN_VENV)/bin/checkov --directory cdk.out --framework cloudformation --quiet --compact --skip-download

$(SCAN_STAMP): $(STAMP)
	test -x $(SCAN_VENV)/bin/python || $(PYTHON) -m venv $(SCAN_VENV)
	$(UV_INSTALL) --python $(SCAN_VENV)/bin/python --quiet checkov==$(CHECKOV_VERSION)
	touch $(SCAN_STAMP)

diff: install
	$(CDK) diff --all

deploy: install
	$(BIN)/mtrl forge-cli
	$(CDK) deploy --all

destroy: install
	$(CDK) destroy --all

bench: install $(LLM_STAMP)
	$(BIN)/python -m bench.synth
	$(BIN)/python -m bench.envs
	$(BIN)/python -m bench.router
	$(BIN)/python -m bench.trajectories
	$(BIN)/python -m bench.validate
	$(BIN)/python -m bench.local
	$(BIN)/python -m bench.llm_trainer --model tiny
	$(BIN)/python -m bench.gpu_check

# Mutation testing of the money- and data-critical modules (bench/mutate.py); not in CI.
# `make mutate MODULES=domain/runs.py` for one.
mutate: install
	$(BIN)/python -m bench.mutate $(MODULES)

clean:
	rm -rf cdk.out .pytest_cache .ruff_cache build *.egg-info
