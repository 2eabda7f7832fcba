"""Test support: fault-injecting stores, the crash gateway, throwaway PostgreSQL clusters, loopback serving.

Not shipped in the bastion package; tests import ``tests.support.X``, and bench/ scripts
find it through ``bench/repo_path.py``.
"""
