"""examples package of Bastion."""
