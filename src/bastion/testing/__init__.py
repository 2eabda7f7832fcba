"""testing package of Bastion."""
