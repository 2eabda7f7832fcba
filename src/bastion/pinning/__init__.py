"""Pinned definitions: nothing an agent reads changes behind the operator's back (issue 27)."""
