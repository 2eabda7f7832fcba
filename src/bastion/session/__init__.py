"""session package of Bastion."""
