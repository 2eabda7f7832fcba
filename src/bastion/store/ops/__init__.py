"""The store contract's operations, written once for every engine (see ``store/statements.py``)."""
