"""The power limit as a lever: the first degrade step of a hot (not critical) card lowers its power limit
(no restart) and the batch steps follow only if it stays hot; recover restores it; never below the card's
minimum; the set/get path of pynvml's real library against the fake libnvidia-ml (as root it succeeds,
NO_PERMISSION when not root, NOT SUPPORTED on a card without constraints)."""

from __future__ import annotations

import time

from hwprofile.config.settings import Watch
from hwprofile.daemon import policy
from hwprofile.daemon.policy import InstanceActionState, PowerLever, ThermalState
from hwprofile.host.sampler import GpuReading, GpuSampler

S = Watch(hot_c=82, warm_c=75, critical_c=88, hysteresis_c=3, dwell_s=3, throttle_s=5, recover_s=20)


def run(trace, lever: PowerLever | None):
    thermal: dict[int, ThermalState] = {}
    acts: dict[str, InstanceActionState] = {}
    out = []
    for t, temp in enumerate(trace):
        now = float(t)
        r = GpuReading(0, now, temperature_c=float(temp), slowdown_c=95.0)
        thermal[0], _ = policy.thermal_step(thermal.get(0, ThermalState()), r, S, now)
        d = policy.decide_actions({"a": (0,)}, thermal, acts, S, now, None, lever)
        acts.update(d.states)
        out += [(now, a.kind, a.level) for a in d.actions]
    return out


LEVER = PowerLever(frozenset({"a"}), hold_s=10.0, factor=0.85)


def test_hot_lowers_the_power_first_and_the_batch_follows_only_if_still_hot() -> None:
    # hot from t=5 (dwell 3 -> hot at 8): power at 8; still hot 10 s later -> degrade step 1 at 18
    assert run([60] * 5 + [84] * 20, LEVER) == [(8.0, "power", 0), (18.0, "degrade", 1)]
    # the same trace without the lever: the batch step at once
    assert run([60] * 5 + [84] * 20, None) == [(8.0, "degrade", 1)]


def test_a_card_the_power_step_cooled_recovers_without_a_restart_and_critical_skips_it() -> None:
    acts = run([60] * 5 + [84] * 6 + [70] * 30, LEVER)
    # cool (below 79) from t=11, recover_s 20 -> recover at step 0: the power limit back, no batch step
    assert acts == [(8.0, "power", 0), (31.0, "recover", 0)]
    assert run([60] * 5 + [90] * 10, LEVER)[0] == (8.0, "degrade", 2)  # critical: the deeper step at once


def test_power_target_never_below_the_cards_minimum() -> None:
    assert policy.power_target(350_000, 100_000, 0.85) == 297_500
    assert policy.power_target(200_000, 180_000, 0.85) == 180_000
    assert policy.power_target(150_000, 150_000, 0.85) == 150_000  # at its minimum: nothing to lower


def test_the_power_limit_set_and_get_path_through_pynvml(fake_host) -> None:
    host = fake_host("rtx4090-1x")
    sampler = GpuSampler()
    try:
        limit, lo, _hi, err = sampler.power_limits(0)
        assert limit == 450_000 and lo is None and "Not Supported" in (err or "")  # no constraints
        time.sleep(0.01)
        host.set_state(**{"dev0.power_limit_min_mw": 150_000, "dev0.power_limit_max_mw": 600_000})
        assert sampler.power_limits(0) == (450_000, 150_000, 600_000, None)
        assert "Invalid Argument" in (sampler.set_power_limit(0, 100_000) or "")  # below the minimum: refused
        assert sampler.set_power_limit(0, 382_500) is None
        assert sampler.power_limits(0)[0] == 382_500
        (r,) = sampler.sample(0.0)
        assert r.power_limit_watts == 382.5  # the enforced limit the sampler reads follows
        time.sleep(0.01)
        host.set_state(**{"dev0.err.nvmlDeviceSetPowerManagementLimit": 4})
        assert "Insufficient Permissions" in (sampler.set_power_limit(0, 450_000) or "")
    finally:
        sampler.close()


class _Sampler:
    """A sampler that answers readings at the times the test's clock gives (no thread timing involved)."""

    def __init__(self, draws: list[tuple[float, float]]) -> None:
        self.draws = draws
        self.error = None

    def sample(self, now: float) -> tuple[GpuReading, ...]:
        draw = next(w for t, w in reversed(self.draws) if now >= t)
        return (GpuReading(0, now, temperature_c=60.0, power_draw_watts=draw, power_limit_watts=300.0),)


def test_bench_records_energy_and_tokens_per_second_per_watt() -> None:
    from hwprofile.bench.tags import GpuTrack, per_watt

    track = GpuTrack(0)
    sampler = _Sampler([(0.0, 100.0), (2.0, 300.0)])
    for t in (0.0, 1.0, 2.0, 3.0, 4.0):  # 1 s at 100 W, then (the interval ending at 2) 300 W for 3 s
        track.add(sampler.sample(t)[0])
    j = track.to_json("A100")
    assert j["energy_j"] == 100 + 300 * 3 and j["power_w"] == {
        "mean": 250.0,
        "max": 300.0,
        "limit_min": 300.0,
        "limit_max": 300.0,
    }
    hw = {"power_w_mean": 250.0}
    assert per_watt(1000.0, hw) == 4.0 and per_watt(1000.0, {"power_w_mean": None}) is None


def test_bench_hardware_tags_sum_the_gpus_draw(fake_host) -> None:
    from clock import ManualClock

    from hwprofile.bench.tags import HardwareSampler

    fake_host("a800-pcie-4x-2numa")
    clock = ManualClock(0.0)
    s = HardwareSampler({i: "A800" for i in range(4)}, interval_s=600, clock=clock)
    with s:  # a reading at the start (t=0) and one at the end (t=2): the thread's next is 600 s away
        clock.advance(2.0)
    tags = s.tags()
    assert tags["status"] == "ok"
    # the fixture's cards draw 60 W each over the 2 s between the readings
    assert [g["energy_j"] for g in tags["gpus"]] == [120.0] * 4 and tags["power_w_mean"] == 240.0
    assert all(g["power_w"]["max"] == 60.0 and g["power_w"]["limit_max"] == 300.0 for g in tags["gpus"])


def test_plan_explain_says_what_the_power_step_does_here(tmp_path, fake_nvml_dir) -> None:
    import subprocess
    import sys

    from conftest import cli_env
    from fakehost import build

    host = build("rtx3090-1x", tmp_path / "host")
    env = {**cli_env(host, fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc")}
    out = {}
    for f in ("0.85", "0"):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "hwprofile",
                "plan",
                "--model",
                "Qwen/Qwen3-0.6B",
                "--explain",
                f"--set=degrade.power_limit_factor={f}",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        out[f] = r.stdout
    assert "degrade.power_limit_factor = 0.85" in out["0.85"] and "RTX 3090: 350 -> 298 W" in out["0.85"]
    assert "0: a hot card goes straight to the batch steps" in out["0"]
