"""``hwprofile bench``: vLLM's own ``vllm bench serve`` driven against a served plan, with every
result tagged with what the hardware did during the run.

- :mod:`.workloads`: the named workloads (seed, latency, sweep) as data, from ``bench.*`` settings;
- :mod:`.runner`: the ``vllm bench serve`` argv, running it, its saved JSON read into typed points,
  the speculative-decoding counters from ``/metrics`` before and after;
- :mod:`.tags`: the NVML sampler thread (temperature, SM clock, clock-event reasons) and the host tags;
- :mod:`.knee` (pure): the saturation sweep's knee and the recommended ``max_num_seqs``;
- :mod:`.compare` (pure): per-round ratios of two plans, median and spread;
- :mod:`.plot`: throughput and p99 TTFT against concurrency, one line per plan (PNG);
- :mod:`.report`: the text report, its first line about throttling, the verdict against the target;
- :mod:`.result`: the ``hwprofile.bench/1`` document (schemas/hwprofile.bench-1.schema.json);
- :mod:`.campaign`: rounds x plans x concurrencies (launching and the point runner passed in), then
  the document, the plot and the report.
"""
