"""policy package of Bastion."""
