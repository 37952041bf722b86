"""Planning at any host size: link look-up by pair index, and plans of 8 to 64 GPUs (the figures
are in benchmarks/bench_plan.py)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from fakehost import scaled_snapshot

from hwprofile.host import snapshot as snapmod
from hwprofile.host.snapshot import GpuLink, HostSnapshot
from hwprofile.host.snapshot_io import snapshot_from_dict


def _scan(host: HostSnapshot, a: int, b: int) -> GpuLink | None:
    """The look-up as it was: the first listed link joining a and b."""
    return next((lk for lk in host.gpu_links if {lk.a, lk.b} == {a, b}), None)


def test_link_either_order_first_listed_and_unknown_pair() -> None:
    first, second = GpuLink(1, 0, "NV4", True), GpuLink(0, 1, "SYS", False)
    host = HostSnapshot(gpu_links=(first, GpuLink(1, 2, "PIX", True), second))
    assert host.link(0, 1) is first and host.link(1, 0) is first
    assert host.link(2, 1) == GpuLink(1, 2, "PIX", True)
    assert host.link(0, 2) is None and host.link(5, 5) is None
    assert HostSnapshot().link(0, 1) is None


def test_link_index_agrees_with_a_scan_of_every_pair_at_64_gpus() -> None:
    host = snapshot_from_dict(scaled_snapshot(64))
    for a in range(65):
        for b in range(65):
            assert host.link(a, b) == _scan(host, a, b), (a, b)


def test_index_built_once_per_link_list_and_not_in_the_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    host = snapshot_from_dict(scaled_snapshot(16))
    built: list[int] = []
    orig = snapmod._link_index

    def counting(links: tuple[GpuLink, ...]) -> dict[tuple[int, int], GpuLink]:
        hit = snapmod._LINK_INDEX.get(id(links))
        if hit is None or hit[0] is not links:
            built.append(len(links))
        return orig(links)

    monkeypatch.setattr(snapmod, "_link_index", counting)
    for a in range(16):
        for b in range(16):
            host.link(a, b)
    assert built == [16 * 15 // 2]
    # a snapshot rebuilt from its JSON is equal, and its JSON is the same: the index is no part of it
    again = snapshot_from_dict(json.loads(host.to_json()))
    assert again == host and again.to_json() == host.to_json()
    again.link(0, 1)
    assert built == [16 * 15 // 2, 16 * 15 // 2]


@pytest.mark.parametrize("n", [16, 32, 64])
def test_plan_of_a_large_host_places_every_gpu_once(n: int, tmp_path: Path) -> None:
    from hwprofile.cli import main

    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps(scaled_snapshot(n)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--json", "--from", str(snap)]) == 0
    plan = json.loads(out.getvalue())
    used = sorted(g for inst in plan["instances"] for g in inst["gpus"])
    assert used == list(range(n))


def test_catalog_family_is_the_catalog_filtered_by_model_type() -> None:
    """The draft and smaller-model searches parse only the target's family: the same models, in
    the same order, as filtering every parsed catalog model."""
    from hwprofile.model import catalog_family, catalog_models

    every = catalog_models()
    types = {m.model_type for m in every}
    assert len(types) > 3
    for t in [*types, "no-such-type"]:
        assert catalog_family(t) == tuple(m for m in every if m.model_type == t), t
