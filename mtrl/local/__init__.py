"""Local mode: the pipeline's pieces served on this machine, offline."""
