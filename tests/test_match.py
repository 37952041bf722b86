"""GPU-class matching: fixture host → profile, decided by detected facts, with reasons."""

from __future__ import annotations

import json

import inproc
import pytest

from hwprofile.host.snapshot import Gpu, GpuLink, HostSnapshot, NumaNode
from hwprofile.match.rules import host_facts, load_rules, match

EXPECTED = {
    "a800-pcie-4x-2numa": "a800-80g-pcie",
    "a800-sxm4-80g-8x": "generic-nvlink",  # an A800 SXM board HAS NVLink: not the no-NVLink profile
    "rtx4090-1x": "rtx4090-24g",
    "rtx3060-12g-1x": "geforce-12g",
    "rtx4070-12g-1x": "geforce-12g",
    "rtx3090-2x": "rtx3090-dual",
    "a100-80g-pcie-1x": "a100-80g",
    "a100-40g-pcie-1x": "generic-medium",  # an A100 40GB is not the 80G class
    "a100-sxm4-80g-8x": "generic-nvlink",
    "h100-sxm-8x": "generic-nvlink",
    "no-driver": "cpu-only",
    "gpu-lost-2x": "rtx4090-24g",  # one usable 4090 left
}


@pytest.mark.parametrize(("name", "profile"), sorted(EXPECTED.items()))
def test_fixture_host_matches(name: str, profile: str, host_of, empty_root) -> None:
    winner, results = match(load_rules(empty_root), host_facts(host_of(name)))
    assert winner is not None and winner.rule.profile == profile
    assert winner.matched and all(c.ok for c in winner.checks)
    # every rule before the winner failed at least one predicate, and says which
    for res in results[: results.index(winner)]:
        assert not res.matched and any(not c.ok for c in res.checks)


def _gpu(i: int, name: str, gib: int, numa: int = 0, links: int = 0) -> Gpu:
    return Gpu(
        index=i,
        name=name,
        memory_total_bytes=gib * 2**30,
        compute_capability="8.0",
        numa_node=numa,
        nvlink_active_links=links,
    )


def test_single_a800_sxm_board_is_not_the_pcie_class(empty_root) -> None:
    host = HostSnapshot(
        gpus=(_gpu(0, "NVIDIA A800-SXM4-80GB", 80, links=8),), numa_nodes=(NumaNode(0, "0-15"),)
    )
    winner, _ = match(load_rules(empty_root), host_facts(host))
    # one 80 GB board with NVLink but no peer: the generic large-memory class, not the PCIe seed's
    assert winner.rule.profile == "generic-large"


def test_mixed_gpus_get_the_mixed_profile(empty_root) -> None:
    host = HostSnapshot(
        gpus=(_gpu(0, "NVIDIA GeForce RTX 4090", 24), _gpu(1, "NVIDIA GeForce RTX 3090", 24)),
        gpu_links=(GpuLink(0, 1, "PHB", False),),
    )
    facts = host_facts(host)
    assert not facts.homogeneous
    winner, _ = match(load_rules(empty_root), facts)
    assert winner.rule.profile == "generic-mixed"


def test_partial_nvlink_is_neither_true_nor_false() -> None:
    host = HostSnapshot(
        gpus=(_gpu(0, "X", 80, links=4), _gpu(1, "X", 80, links=4), _gpu(2, "X", 80), _gpu(3, "X", 80)),
        gpu_links=(
            GpuLink(0, 1, "NV4"),
            GpuLink(0, 2, "SYS"),
            GpuLink(0, 3, "SYS"),
            GpuLink(1, 2, "SYS"),
            GpuLink(1, 3, "SYS"),
            GpuLink(2, 3, "PIX"),
        ),
    )
    assert host_facts(host).nvlink is None


def test_site_rules_come_first(empty_root, host_of) -> None:
    (empty_root / "rules.d").mkdir()
    (empty_root / "rules.d" / "10-site.yaml").write_text(
        "rules:\n  - profile: generic-small\n    why: our 4090s run small models\n    when: {gpu_name: 'RTX 4090'}\n"
    )
    winner, _ = match(load_rules(empty_root), host_facts(host_of("rtx4090-1x")))
    assert winner.rule.profile == "generic-small"
    assert winner.rule.file.endswith("10-site.yaml") and winner.rule.line == 2


def test_unknown_predicate_is_reported_with_line(empty_root) -> None:
    from hwprofile.config import ConfigError

    (empty_root / "rules.d").mkdir()
    (empty_root / "rules.d" / "x.yaml").write_text("rules:\n  - profile: base\n    when: {gpu_nmae: A100}\n")
    with pytest.raises(ConfigError) as e:
        load_rules(empty_root)
    assert "x.yaml:2" in str(e.value) and "did you mean 'gpu_name'" in str(e.value)


def test_rule_lines_point_at_their_items(empty_root) -> None:
    """Each rule carries the line its list item starts on, whatever the order of its keys."""
    (empty_root / "rules.d").mkdir()
    (empty_root / "rules.d" / "x.yaml").write_text(
        "rules:\n  - profile: base\n\n  # a comment\n  - when: {gpu_count: 2}\n    profile: cpu-only\n"
    )
    rules = load_rules(empty_root)
    assert [(r.profile, r.line) for r in rules[:2]] == [("base", 2), ("cpu-only", 5)]
    for r in rules[2:]:  # the built-in ones
        with open(r.file) as f:
            text = f.read().splitlines()[r.line - 1]
        assert text.strip().startswith("- ") and f"profile: {r.profile}" in text, (r.line, text)


def test_profiles_command(tmp_path, fake_nvml_dir, empty_root) -> None:
    from fakehost import build

    host = build("a800-pcie-4x-2numa", tmp_path / "h")
    env = {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(empty_root)}
    r = inproc.hwprofile(["profiles", "--json"], env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["chosen"] == "a800-80g-pcie"
    chosen = [x for x in out["rules"] if x["chosen"]]
    assert len(chosen) == 1 and all(c["ok"] for c in chosen[0]["checks"])
    assert {p["name"] for p in out["profiles"]} >= {"base", "cpu-only", "a800-80g-pcie", "rtx3090-dual"}
    human = inproc.hwprofile(["profiles"], env).stdout
    assert "=> a800-80g-pcie" in human and "Chosen: a800-80g-pcie" in human


def test_a_plan_reads_its_profile_chain_not_every_profile(
    host_of, empty_root, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resolving the settings reads the matched profile and its ancestors of the built-ins (and every
    site profile, validated at once); the mapping lists and orders the profiles as load_profiles
    does, a site profile shadowing the built-in of its name."""
    from hwprofile import pipeline
    from hwprofile.match import profiles as prof

    (empty_root / "profiles").mkdir()
    (empty_root / "profiles" / "rtx4090-24g.yaml").write_text("extends: base\n")  # shadows a built-in
    (empty_root / "profiles" / "aaa-site.yaml").write_text("extends: base\n")
    read: list[str] = []
    real = prof.load_file

    def counting(path: str) -> tuple[object, dict[tuple[str, ...], int]]:
        read.append(str(path))
        return real(path)

    monkeypatch.setattr(prof, "load_file", counting)
    res = pipeline.resolve_settings(host_of("a800-pcie-4x-2numa"), empty_root)
    chain = [pf.path for pf in res.chain]
    assert res.profile == "a800-80g-pcie" and len(chain) >= 2  # the profile and base at least
    site = sorted(str(p) for p in (empty_root / "profiles").iterdir())
    builtin_read = sorted(p for p in read if p not in site)
    assert builtin_read == sorted(chain)  # each of the chain's files once, no other built-in
    assert sorted(p for p in read if p in site) == site  # the site's all read (and validated)
    every = prof.load_profiles(empty_root)
    lazy = prof.site_and_builtin(empty_root)
    assert list(lazy) == list(every) and len(lazy) == len(every) > len(chain)
    assert "aaa-site" in lazy and "no-such" not in lazy
    assert lazy["rtx4090-24g"].kind == "etc-profile" and lazy["rtx4090-24g"] == every["rtx4090-24g"]
    assert all(lazy[n] == every[n] for n in every)
