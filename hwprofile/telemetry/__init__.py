"""The instruments every user of a running vLLM stands on (the supervisor, the daemon, ``watch``,
``bench``, ``verify``, ``plan --advice-from``): HTTP to an instance without any proxy
(:mod:`.http`), vLLM's ``/metrics`` parsed (:mod:`.metrics`) and scraped over one bounded path
(:mod:`.scrape`), counter increases and quantiles over a window (:mod:`.window`). The GPU side is
:mod:`hwprofile.host.sampler` (NVML stays inside ``host/``)."""
