"""Supervision: run the rendered vLLM instances, watch them, restart them, stop them. It has side
effects (processes, signals, files), as ``runtime``, ``daemon`` and ``launch`` do:
:mod:`.supervisor` (the instances of a plan, the lock, the state file), :mod:`.instance` (one
instance's life cycle), :mod:`.child` (its process and process group), :mod:`.tether` (a vLLM tied
to its supervisor's life), :mod:`.logs` (its output on tmpfs, and on stdout in a pod), :mod:`.group`
(a multi-node group's readiness), :mod:`.front` (nginx in front of separate servers, for bench),
:mod:`.runfiles` (the runtime directory's files: one writer, one trusted reader), :mod:`.gate`
(the start gate: each start of a GPU instance waits, bounded, for its GPUs' memory; the policy is
pure, the readings a callable), :mod:`.pools` (the KV pool vLLM measured, recorded for a pin).
The decisions it takes on failures and at start-up (classification, startup verification, the NUMA
binding vLLM logged) are pure functions in :mod:`.failures`, :mod:`.verify` and :mod:`.numalog`;
the out-of-memory ladder's next step is :mod:`.failures`', re-planned by :mod:`.ladder` (which calls
only the re-plan function it is given)."""
