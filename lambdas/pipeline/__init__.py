"""The training pipeline's steps: plain functions of their AWS clients, called by thin handlers."""
