"""The rooms of one gateway replica, composed by :class:`bastion.gateway.Gateway` (issue 26).

Each module owns one responsibility the gateway used to hold in one class: its
process options (``options.py``), opening the store and the recorders it writes
with (``startup.py``, ``evidence_wiring.py``), taking over a dead peer's
generation (``peers.py``), the live transport sessions (``sessions.py``),
revocation (``revocation.py``), following the policy file and the fleet's
reloads (``policy_follow.py``), the links that make replicas interchangeable
(``links.py``), attachment records (``attachment_links.py``) and the readiness
report (``readiness.py``). A room reads the gateway through the small
:class:`~bastion.replica.host.ReplicaHost` protocol, never by importing it.
"""
