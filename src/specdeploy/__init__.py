"""specdeploy: deploy and benchmark speculative decoding (DFlash, DDTree) reproducibly."""

__version__ = "0.1.0"
