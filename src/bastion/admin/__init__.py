"""admin package of Bastion."""
