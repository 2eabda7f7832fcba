"""Bastion: a fail-closed gateway for the Model Context Protocol."""

from bastion.errors import BastionError, Reason

__all__ = ["BastionError", "Reason", "__version__"]

__version__ = "0.1.0"
