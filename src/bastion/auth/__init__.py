"""auth package of Bastion."""
