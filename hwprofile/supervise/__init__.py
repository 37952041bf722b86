"""Supervision: run the rendered vLLM instances, watch them, restart them, stop them. It has side
effects (processes, signals, files), as ``runtime``, ``daemon``, ``launch`` and ``service`` do; the
decisions it takes on failures (classification, the out-of-memory ladder, startup verification) are
pure functions in :mod:`.failures` and :mod:`.verify`."""
