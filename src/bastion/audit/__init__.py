"""audit package of Bastion."""
