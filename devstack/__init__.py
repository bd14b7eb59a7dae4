"""Development-only: the harness that starts simulated clouds and our server, and the demo.

Not part of the distribution (the wheel ships ``protos``, ``server`` and ``providers`` only). It
sits beside ``simulators`` rather than inside it because it starts the server, and the simulators
import nothing from the server or the providers. Run it from the repository root:
``python -m devstack`` is the demo ``make run`` starts.
"""
