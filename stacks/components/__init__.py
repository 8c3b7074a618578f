"""Constructs of the long-lived platform, composed by the stacks in `stacks/`."""
