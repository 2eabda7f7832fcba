"""admission package of Bastion."""
