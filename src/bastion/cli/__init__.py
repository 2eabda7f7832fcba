"""cli package of Bastion."""
