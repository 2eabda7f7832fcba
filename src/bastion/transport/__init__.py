"""transport package of Bastion."""
