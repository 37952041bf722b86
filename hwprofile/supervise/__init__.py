"""Supervision: run the rendered vLLM instances, watch them, restart them, stop them. The only layer
besides detection with side effects (processes, signals, files); the decisions it takes on failures
(classification, the out-of-memory ladder, startup verification) are pure functions in
:mod:`.failures` and :mod:`.verify`."""
