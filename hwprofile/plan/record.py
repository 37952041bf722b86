"""The records now live in :mod:`hwprofile.record` (below ``release/`` and ``config/``, which declare
records too); this name stays for the modules that still import it from here."""

from ..record import record, state

__all__ = ["record", "state"]
