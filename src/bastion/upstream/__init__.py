"""upstream package of Bastion."""
