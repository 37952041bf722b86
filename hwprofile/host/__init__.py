"""The host: what hwprofile reads from it and the frozen record of that.

- :mod:`.detect` (with :mod:`.linux`, :mod:`.nvml`, :mod:`.software`): detection, the only code that
  reads the host (procfs, sysfs, NVML, the installed software); it changes nothing there.
- :mod:`.snapshot`: the frozen ``HostSnapshot`` detection returns, saved and replayed as
  ``hwprofile.host/1`` JSON; everything downstream (match, plan, render) reads only this.
"""
