"""store package of Bastion."""
