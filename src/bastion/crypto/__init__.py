"""crypto package of Bastion."""
