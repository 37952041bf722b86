"""The host: what hwprofile reads from it and the frozen record of that.

- :mod:`.detect` (with :mod:`.linux`, :mod:`.nvml`, :mod:`.software`): detection, the only code that
  reads the host (procfs, sysfs, NVML, the installed software); it changes nothing there.
- :mod:`.snapshot`: the frozen ``HostSnapshot`` detection returns and its ``hwprofile.host/1`` JSON;
  everything downstream (match, plan, render) reads only this.
- :mod:`.snapshot_io`: a saved snapshot read back (``--from FILE``), checked by :mod:`.snapshot_check`
  (the field table, in the rule vocabulary of :mod:`hwprofile.contracts`); :mod:`.snapshot_schema`
  publishes the same table as JSON Schema. Detection imports none of these.
- :mod:`.sampler` (the daemon's and bench's GPU readings at every tick) and :mod:`.gpumem` (the GPUs'
  memory before each start of an instance: the start gate's readings) read NVML through :mod:`.nvml`.
"""
