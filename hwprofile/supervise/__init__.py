"""Supervision: run the rendered vLLM instances, watch them, restart them, stop them. It has side
effects (processes, signals, files), as ``runtime``, ``daemon``, ``launch`` and ``service`` do:
:mod:`.supervisor` (the instances of a plan, the lock, the state file), :mod:`.instance` (one
instance's life cycle), :mod:`.child` (its process and process group), :mod:`.logs`, :mod:`.state`,
:mod:`.session`. The decisions it takes on failures (classification, startup verification) are pure
functions in :mod:`.failures` and :mod:`.verify`; the out-of-memory ladder's next step is
:mod:`.failures`', re-planned by :mod:`.ladder` (which calls only the re-plan function it is given)."""
