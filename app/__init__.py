"""topoguard: keep a distributed training group in one zone whose network paths are open."""

__version__ = "0.1.0"
