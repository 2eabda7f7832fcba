"""Step-up approval of one tool call (issue 27, DESIGN section 8).

``step_up.py`` is the call's side (ask, wait, audit, answer); ``waiters.py``
wakes a waiting call when a decision lands; ``views.py`` is what an approver
sees. The requests themselves live in the store (``store/approvals.py``), so
any replica takes the decision and the replica holding the call learns it.
"""
