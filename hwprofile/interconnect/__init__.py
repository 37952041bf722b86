"""The interconnect check: prove that an all-reduce across a planned TP group returns the right
numbers, in time, with peer-to-peer on and off, before a plan with TP > 1 relies on it.

:mod:`.check` runs each rank as its own short-lived process (:mod:`.worker`, through the installed
vLLM's own PyTorch) under a hard deadline and kills the process group when it passes (a hang is a
result); :mod:`.store` keeps the result per host fingerprint. The planner reads the recorded result
(:mod:`hwprofile.plan.interconnect`), it never runs it.
"""
