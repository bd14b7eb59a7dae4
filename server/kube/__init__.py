"""Optional Kubernetes features: leader election, a durable change journal, learned templates, Events.

All are off by default and switched on under ``kubernetes:`` in the config file (``settings.py``). With
none of them on, the server never imports the ``kubernetes`` client and needs no RBAC at all (the
sidecar layout). ``integration.py`` builds the enabled features; each lives in its own module.
"""
