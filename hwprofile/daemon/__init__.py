"""The daemon: watch what the GPUs and vLLM do, decide by policy, act, publish.

- ``telemetry``: one sample per tick (NVML through the detection chokepoint, each instance's
  ``/metrics``) into frozen readings; a failed reading is ``None`` with a status, never an exception.
- ``window``: counter increases and histogram quantiles over a sliding window (reset-aware).
- ``policy``: pure functions, readings in, decisions out, each with its reason and readings.
- ``exporter``: hwprofile's own Prometheus metrics, read from one immutable published snapshot.
- ``loop``: the main loop (one owner of all state) that ties them to the supervisor.
- ``service``: the daemon's systemd unit (``install-service``) and the reload client.
"""
