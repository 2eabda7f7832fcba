"""Resources, prompts and completion through the gateway (issue 9; DESIGN section 5, last paragraph).

One module per path, each reading in DESIGN section 2's step order as ``call.py`` does:
``resources.py`` (list, templates, read), ``prompts.py`` (list, get), ``completion.py``.
``uris.py`` maps resource URIs reversibly; ``pages.py`` is the cross-upstream cursor;
``relay.py`` is what the paths share (the upstream context, the audit entry).
"""
