"""workers package of Bastion."""
