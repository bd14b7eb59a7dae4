"""HTTP simulators of the cloud APIs the backends talk to (Scaleway Kapsule, Bizfly Cloud).

They are written from the clouds' API facts and import nothing from ``providers`` or ``server``,
so a backend bug cannot hide behind a simulator that shares its code.
"""
