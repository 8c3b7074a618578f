"""nova-mtrl's command line (`mtrl`) and local mode."""

__version__ = "0.1.0"
