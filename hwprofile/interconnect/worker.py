"""One rank of the interconnect check; run as ``python -m hwprofile.interconnect.worker``.

Environment (set by :mod:`.check`): ``RANK``, ``WORLD_SIZE``, ``HWPROFILE_IC_INIT`` (a
``tcp://host:port`` rendezvous), ``HWPROFILE_IC_BACKEND`` (``nccl`` or ``gloo``),
``HWPROFILE_IC_SIZES`` (comma-separated element counts of float32), ``HWPROFILE_IC_ITERS``.
``HWPROFILE_IC_PLANT`` plants a fault for the tests: ``wrong:<rank>`` (that rank adds 1 to its
tensor), ``hang:<rank>`` (that rank sleeps instead of joining the all-reduce) or ``exit:<rank>``
(that rank exits with status 3 before the rendezvous).

Prints one JSON line per size: ``{"rank", "elements", "bytes", "exact", "mismatches", "seconds"}``.
Each rank fills ``(arange(n) % 1024) * (rank + 1)``: small integers, exact in float32, so the sum
is known exactly: ``(arange(n) % 1024) * world (world + 1) / 2``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta


def main() -> int:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    backend = os.environ.get("HWPROFILE_IC_BACKEND", "gloo")
    sizes = [int(s) for s in os.environ["HWPROFILE_IC_SIZES"].split(",")]
    iters = int(os.environ.get("HWPROFILE_IC_ITERS", "3"))
    plant, _, plant_rank = os.environ.get("HWPROFILE_IC_PLANT", "").partition(":")
    planted = plant_rank.strip() == str(rank)
    if planted and plant == "exit":
        return 3  # a rank that dies before the rendezvous
    timeout = timedelta(seconds=float(os.environ.get("HWPROFILE_IC_TIMEOUT_S", "600")))
    dist.init_process_group(
        backend, init_method=os.environ["HWPROFILE_IC_INIT"], rank=rank, world_size=world, timeout=timeout
    )
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)

        def sync() -> None:
            torch.cuda.synchronize(device)
    else:
        device = torch.device("cpu")

        def sync() -> None:
            return None

    for n in sizes:
        base = (torch.arange(n, dtype=torch.int64) % 1024).to(torch.float32).to(device)
        x = base * (rank + 1)
        if planted and plant == "wrong":
            x += 1
        if planted and plant == "hang":
            time.sleep(86400)
        expected = base * (world * (world + 1) // 2)
        times: list[float] = []
        y = x
        for _ in range(1 + iters):  # the first is a warm-up, not timed
            y = x.clone()
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(y)
            sync()
            times.append(time.perf_counter() - t0)
        mismatches = int((y != expected).sum().item())
        row = {
            "rank": rank,
            "elements": n,
            "bytes": n * 4,
            "exact": mismatches == 0,
            "mismatches": mismatches,
            "seconds": sorted(times[1:])[len(times[1:]) // 2] if iters else times[0],
        }
        sys.stdout.write(json.dumps(row) + "\n")
        sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
