"""envbuild: reproducible PyTorch environments from declarative profiles."""

__version__ = "0.1.0"
