"""Pure policy: readings in, decisions out, each with its reason and the readings behind it.

Nothing here reads a clock, a file or the network: time arrives as ``now`` (monotonic seconds),
state is returned, not kept. The loop owns the state and acts on the decisions.

Thermal states per GPU, ``ok`` < ``warm`` < ``hot`` < ``critical``:

- A reading maps to a level by the absolute thresholds of the profile (``watch.warm_c``, ``hot_c``,
  ``critical_c``) and, where the card reports it, by its own headroom to its slowdown threshold
  (``watch.*_margin_c``): the stricter of the two wins, so a card that slows down early is
  protected early. The headroom is NVML's temperature margin where the driver has it, else the
  card's slowdown threshold minus its temperature.
- Thermal clock-event reasons (``sw_thermal_slowdown``, ``hw_thermal_slowdown``, ``hw_slowdown``)
  active for ``watch.throttle_s`` count as ``hot`` whatever the temperature. Power-cap throttling is
  reported, never acted on.
- Up: a higher level must hold for ``watch.dwell_s`` (one spike never acts). Down: the reading must
  stay below the level's thresholds by ``watch.hysteresis_c`` for ``dwell_s``.
- A reading without a temperature (nor a headroom) was not made: it holds the committed level,
  what is pending and since when, and the cool time for ``watch.unknown_s`` (so a read that fails
  now and then neither resets the hot dwell nor counts as cool); past that the GPU is ``unknown``
  (its own state; the level it last had is kept beside it). A lost GPU is ``lost``. Neither is
  ever cool: a level goes down, and an instance recovers, only on readings that were made.

Actions per instance (the instance's level is the worst of its GPUs): ``hot`` → degrade step 1,
``critical`` → step 2, cool (below ``hot`` by the hysteresis, no thermal throttling) for
``watch.recover_s`` → recover to the full profile, decided only on a tick at which every GPU of the
instance was read (none unread, unknown or lost). Each instance acts at most
``watch.max_actions_per_hour`` times an hour; an action over the limit is deferred, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..config.settings import Watch
from ..host.sampler import THERMAL_REASONS, GpuReading
from .actions import Action, Degrade, Drain, PowerCap, Recover
from .readings import DriftReading, Progress

LEVELS = ("ok", "warm", "hot", "critical")


@dataclass(frozen=True)
class ThermalState:
    """Per GPU: the committed level, what is pending and since when, how long each reason is on."""

    level: str = "ok"
    since: float | None = None  # when the committed level began
    pending: str | None = None  # a level the readings point to, not yet held for dwell_s
    pending_since: float | None = None
    reasons_since: tuple[tuple[str, float], ...] = ()  # active clock-event reason -> first seen
    cool_since: float | None = None  # below hot by the hysteresis, no thermal throttle, since
    reason: str = "no reading yet"
    lost: bool = False
    unread_since: float | None = None  # first of the readings in a row that were not made
    unknown: bool = False  # not read for watch.unknown_s: ``level`` is the last known

    def reason_active_s(self, now: float) -> dict[str, float]:
        return {name: now - t for name, t in self.reasons_since}

    @property
    def read(self) -> bool:
        """The last reading was made (a temperature or a headroom): decisions down may use it."""
        return self.unread_since is None and not self.unknown and not self.lost

    @property
    def shown(self) -> str:
        """The state as reported: ``gpu_lost``, ``unknown``, or the level."""
        return "gpu_lost" if self.lost else ("unknown" if self.unknown else self.level)


def _rank(level: str) -> int:
    return LEVELS.index(level)


def _temp_level(temp: float | None, headroom: float | None, s: Watch, slack: float) -> tuple[int, str]:
    """Level of a reading against the thresholds lowered by ``slack`` (0 to go up, the hysteresis to
    go down), with the threshold that decided it."""
    best, why = 0, "below every threshold"
    if temp is not None:
        for i, limit in ((3, s.critical_c), (2, s.hot_c), (1, s.warm_c)):
            if temp >= limit - slack:
                if i > best:
                    best, why = i, f"{temp:.0f} °C >= {LEVELS[i]} {limit - slack:.0f} °C"
                break
    if headroom is not None:
        for i, margin in ((3, s.critical_margin_c), (2, s.hot_margin_c), (1, s.warm_margin_c)):
            if headroom <= margin + slack:
                if i > best:
                    best, why = (
                        i,
                        f"{headroom:.0f} °C below its slowdown threshold <= {LEVELS[i]} margin "
                        f"{margin + slack:.0f} °C",
                    )
                break
    return best, why


def thermal_step(state: ThermalState, r: GpuReading, s: Watch, now: float) -> tuple[ThermalState, str | None]:
    """Advance one GPU's thermal state by one reading. Returns the new state and, when the
    committed level changed, a one-line description of the change (else None)."""
    if r.status == "lost":
        return _lost(state, r)
    if state.lost:
        state = replace(state, lost=False)
    state = replace(state, reasons_since=_reasons_since(state, r, now))
    if r.temperature_c is None and r.headroom_c is None:
        return _unread(state, r, s, now)
    state, change_back = _read_again(state, r, now)
    up, up_why, down = _reading_levels(r, s, state.reasons_since, now)
    # cool: below hot by the hysteresis and no thermal throttling at all
    thermal_now = any(n in THERMAL_REASONS for n, _ in state.reasons_since)
    cool = down < 2 and not thermal_now
    cool_since = (state.cool_since if state.cool_since is not None else now) if cool else None
    state = replace(state, cool_since=cool_since)
    new, change = _move(state, r, s, now, (up, up_why, down))
    return new, change if change is not None else change_back


def _lost(state: ThermalState, r: GpuReading) -> tuple[ThermalState, str | None]:
    """A reading that says the GPU is lost: reported once, on the first such reading; nothing pending
    and nothing cool survives (a lost GPU is never cool)."""
    if state.lost:
        return state, None
    why = r.error or "NVML says the GPU is lost"
    lost = replace(
        state, lost=True, pending=None, pending_since=None, cool_since=None, reason=f"gpu_lost: {why}"
    )
    return lost, f"GPU {r.index} lost: {why}"


def _reasons_since(state: ThermalState, r: GpuReading, now: float) -> tuple[tuple[str, float], ...]:
    """How long each clock-event reason has been on: each active reason with when it was first seen
    (kept from the state while it stays on); a reading without reasons keeps them as they were."""
    if r.reasons is None:
        return state.reasons_since
    old = dict(state.reasons_since)
    return tuple((n, old.get(n, now)) for n in r.reasons)


def _read_again(state: ThermalState, r: GpuReading, now: float) -> tuple[ThermalState, str | None]:
    """A reading made after some that were not: the unread run ends, and a GPU that was unknown says
    it is read again (the line to report, else None)."""
    if state.unread_since is None and not state.unknown:
        return state, None
    change_back = None
    if state.unknown:
        gap = now - (state.unread_since or now)
        change_back = f"GPU {r.index} unknown -> read again after {gap:.0f} s ({describe(r)})"
    return replace(state, unread_since=None, unknown=False), change_back


def _reading_levels(
    r: GpuReading, s: Watch, reasons_since: tuple[tuple[str, float], ...], now: float
) -> tuple[int, str, int]:
    """The level a reading points up to (with why) and the level it allows down to: its temperature and
    headroom against the thresholds (down: lowered by the hysteresis), at least ``hot`` both ways while
    a thermal clock-event reason has been on for ``watch.throttle_s``."""
    up, up_why = _temp_level(r.temperature_c, r.headroom_c, s, 0.0)
    down, _ = _temp_level(r.temperature_c, r.headroom_c, s, s.hysteresis_c)
    throttled = [(n, now - t) for n, t in reasons_since if n in THERMAL_REASONS and now - t >= s.throttle_s]
    if throttled and up < 2:
        name, held = throttled[0]
        up, up_why = 2, f"{name} active for {held:.0f} s (>= watch.throttle_s {s.throttle_s:g} s)"
    if throttled:
        down = max(down, 2)
    return up, up_why, down


def _move(
    state: ThermalState, r: GpuReading, s: Watch, now: float, levels: tuple[int, str, int]
) -> tuple[ThermalState, str | None]:
    """The committed level against what the reading points to (``levels``: up, why, down): held, a
    change pending until it has held ``watch.dwell_s``, or committed (with the line that says so)."""
    up, up_why, down = levels
    cur = _rank(state.level)
    target = up if up > cur else (down if down < cur else cur)
    if target == cur:
        return replace(state, pending=None, pending_since=None, reason=_hold_reason(state, r, up_why)), None
    want = LEVELS[target]
    if state.pending != want:
        state = replace(state, pending=want, pending_since=now, reason=f"{want} pending: {up_why}")
    assert state.pending_since is not None
    if now - state.pending_since < s.dwell_s:
        if state.pending_since == now:
            return state, None
        return replace(state, reason=f"{want} pending for {now - state.pending_since:.0f} s: {up_why}"), None
    why = up_why if target > cur else f"below {state.level} by the hysteresis ({s.hysteresis_c:g} °C)"
    new = replace(state, level=want, since=now, pending=None, pending_since=None, reason=f"{want}: {why}")
    return new, f"GPU {r.index} {state.level} -> {want}: {why} ({describe(r)})"


def _unread(state: ThermalState, r: GpuReading, s: Watch, now: float) -> tuple[ThermalState, str | None]:
    """A reading without a temperature or headroom: hold everything (level, pending and its start, cool
    time) for ``watch.unknown_s``, then the GPU is unknown, with nothing pending and nothing cool."""
    since = state.unread_since if state.unread_since is not None else now
    err = r.error or r.status
    if now - since < s.unknown_s:
        hold = (
            f"no reading ({err}) for {now - since:.0f} s: holding {state.level} "
            f"(unknown after watch.unknown_s {s.unknown_s:g} s)"
        )
        return replace(state, unread_since=since, reason=hold), None
    why = (
        f"no temperature reading for {now - since:.0f} s (watch.unknown_s {s.unknown_s:g} s): {err}; "
        f"last known {state.level}"
    )
    new = replace(
        state,
        unread_since=since,
        unknown=True,
        pending=None,
        pending_since=None,
        cool_since=None,
        reason=f"unknown: {why}",
    )
    return new, (None if state.unknown else f"GPU {r.index} {state.level} -> unknown: {why}")


def instant_level(r: GpuReading, s: Watch) -> tuple[str, str]:
    """What the card is in this one reading, without the dwell a decision waits for: the level of
    its temperature and headroom, at least ``hot`` while a thermal clock-event reason is on (the
    card is slowing down now). For a one-shot look (``watch --once``) and a start (a daemon that
    starts while a card is hot starts its instances degraded)."""
    if r.status == "lost":
        return "gpu_lost", r.error or "NVML says the GPU is lost"
    if r.temperature_c is None and r.headroom_c is None and r.reasons is None:
        return "unknown", f"no reading ({r.error or r.status})"
    level, why = _temp_level(r.temperature_c, r.headroom_c, s, 0.0)
    thermal = [n for n in r.reasons or () if n in THERMAL_REASONS]
    if thermal and level < 2:
        level, why = 2, f"{', '.join(thermal)} active now (the card is slowing itself down)"
    return LEVELS[level], why if level else f"ok: {describe(r)}"


def start_levels(
    instances: Mapping[str, Sequence[int]], readings: Sequence[GpuReading], s: Watch
) -> dict[str, tuple[int, str]]:
    """The degrade step each instance starts at: a card hot or critical right now (its
    :func:`instant_level`) starts its instances at step 1 or 2 rather than at the full profile
    (which would be degraded a dwell later, a restart after the first start)."""
    now = {r.index: instant_level(r, s) for r in readings}
    out: dict[str, tuple[int, str]] = {}
    for name, gpus in instances.items():
        worst = max(
            ((now[g][0], g) for g in gpus if g in now and now[g][0] in LEVELS),
            key=lambda x: _rank(x[0]),
            default=None,
        )
        step = {"critical": 2, "hot": 1}.get(worst[0], 0) if worst else 0
        if step and worst:
            out[name] = (step, f"GPU {worst[1]} is {worst[0]} at start: {now[worst[1]][1]}")
    return out


def _hold_reason(state: ThermalState, r: GpuReading, why: str) -> str:
    return f"{state.level}: {why}" if state.level != "ok" else f"ok: {describe(r)}"


def describe(r: GpuReading) -> str:
    """The readings of one GPU, in a line."""
    parts = []
    if r.temperature_c is not None:
        lim = f" (slowdown {r.slowdown_c:.0f} °C)" if r.slowdown_c is not None else ""
        parts.append(f"{r.temperature_c:.0f} °C{lim}")
    if r.sm_clock_mhz is not None:
        top = f"/{r.sm_clock_max_mhz}" if r.sm_clock_max_mhz else ""
        parts.append(f"SM {r.sm_clock_mhz}{top} MHz")
    if r.reasons:
        shown = [n for n in r.reasons if n != "gpu_idle"]
        if shown:
            parts.append("reasons " + ",".join(shown))
    if r.power_draw_watts is not None:
        top = f"/{r.power_limit_watts:.0f}" if r.power_limit_watts else ""
        parts.append(f"{r.power_draw_watts:.0f}{top} W")
    return ", ".join(parts) or r.status


# -- actions -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InstanceActionState:
    level: int = 0  # degrade step in force (or being applied)
    actions_at: tuple[float, ...] = ()  # when its last actions were taken (for the hourly limit)
    deferred: str | None = None
    power_at: float | None = None  # when its GPUs' power limit was lowered (None: at their own limit)


@dataclass(frozen=True)
class PowerLever:
    """The power limit as the first degrade step (``degrade.power_limit_factor`` > 0): the instances whose
    GPUs take it (not those where setting it failed: not root, no constraints), and how long a lowered limit
    is given before the batch steps follow (``degrade.power_limit_hold_s``)."""

    instances: frozenset[str]
    hold_s: float
    factor: float


def power_target(limit_mw: int, minimum_mw: int, factor: float) -> int:
    """The lowered power limit: ``factor`` of the card's limit, never below its minimum (NVML's
    constraints), never above the limit it has."""
    return min(limit_mw, max(minimum_mw, int(limit_mw * factor)))


@dataclass(frozen=True)
class Decisions:
    actions: tuple[Action, ...] = ()
    deferred: tuple[str, ...] = ()
    states: Mapping[str, InstanceActionState] = field(default_factory=dict)


def _cool_for(t: ThermalState | None, now: float) -> float:
    """Seconds a GPU has been cool, or -1 when it was not read at this tick (unread, unknown, lost)."""
    if t is None or not t.read or t.cool_since is None:
        return -1.0
    return now - t.cool_since


def decide_actions(
    instances: Mapping[str, Sequence[int]],
    thermal: Mapping[int, ThermalState],
    prev: Mapping[str, InstanceActionState],
    s: Watch,
    now: float,
    held: Mapping[str, str] | None = None,
    lever: PowerLever | None = None,
    readings: Mapping[int, GpuReading] | None = None,
) -> Decisions:
    """What to do for each instance given its GPUs' thermal states (pure). ``held``: instances this
    daemon cannot restart on its own, with why (a node of a group over several nodes): what they
    would need is deferred, with that reason, and their step stays. ``lever``: a hot (not critical)
    instance at the full profile first has its GPUs' power limit lowered (``power``: no restart), and
    the batch steps follow only if it is still hot ``lever.hold_s`` later; a recover restores it.
    ``readings``: this tick's reading per GPU, each action's evidence (its GPUs' readings)."""
    readings = readings or {}
    actions: list[Action] = []
    deferred: list[str] = []
    states: dict[str, InstanceActionState] = {}
    for name, gpus in instances.items():
        st = prev.get(name, InstanceActionState())
        st = replace(st, actions_at=tuple(t for t in st.actions_at if now - t < 3600), deferred=None)
        seen = tuple(readings[g] for g in gpus if g in readings)
        states[name], action, msg = _decide_instance(name, gpus, st, thermal, s, now, held, lever, seen)
        if action is not None:
            actions.append(action)
        if msg is not None:
            deferred.append(msg)
    return Decisions(tuple(actions), tuple(deferred), states)


# one instance's outcome at a tick: its new state, the action decided (or None), what was deferred (or None)
_Outcome = tuple[InstanceActionState, Action | None, str | None]


def _decide_instance(
    name: str,
    gpus: Sequence[int],
    st: InstanceActionState,
    thermal: Mapping[int, ThermalState],
    s: Watch,
    now: float,
    held: Mapping[str, str] | None,
    lever: PowerLever | None,
    seen: tuple[GpuReading, ...],
) -> _Outcome:
    """One instance of :func:`decide_actions`: ``st`` has only its actions of the last hour and no
    deferral; ``seen`` its GPUs' readings at this tick. Nothing is decided without a GPU in a state."""
    known = [(g, thermal[g]) for g in gpus if g in thermal and not thermal[g].lost]
    if not known:
        return st, None, None
    worst_gpu, worst = max(known, key=lambda gt: _rank(gt[1].level))
    want = {"critical": 2, "hot": 1}.get(worst.level, st.level)
    if want == 1 and st.level == 0 and lever is not None and name in lever.instances:
        powered = _power_first(name, gpus, st, lever, now, f"GPU {worst_gpu} {worst.reason}", seen)
        if powered is not None:
            return powered
    kind: type[Degrade] | type[Recover] | None = None
    if want > st.level:
        kind, why = Degrade, f"GPU {worst_gpu} {worst.reason}"
    elif (st.level > 0 or st.power_at is not None) and all(
        _cool_for(thermal.get(g), now) >= s.recover_s for g in gpus
    ):
        # every GPU read at this tick and cool long enough: never on a reading that was not made
        want, kind = 0, Recover
        why = f"GPU(s) {list(gpus)} below hot - {s.hysteresis_c:g} °C for >= {s.recover_s:g} s"
    if kind is None:
        return st, None, None
    if kind is Recover and st.level == 0:  # only the power limit to restore: no restart
        return replace(st, power_at=None), Recover(name, why, tuple(gpus), 0, seen), None
    msg = _not_now(name, f"{kind.kind} to step {want}", st, s, held)
    if msg is not None:
        return replace(st, deferred=msg), None, msg
    power_at = None if kind is Recover else st.power_at
    new = replace(st, level=want, actions_at=(*st.actions_at, now), power_at=power_at)
    return new, kind(name, why, tuple(gpus), want, seen), None


def _power_first(
    name: str,
    gpus: Sequence[int],
    st: InstanceActionState,
    lever: PowerLever,
    now: float,
    hot: str,
    seen: tuple[GpuReading, ...],
) -> _Outcome | None:
    """A hot instance at the full profile whose GPUs take the power lever (``hot``: why it is hot): its
    power limit is lowered first, then given ``lever.hold_s``; None once that is over (the batch steps
    follow)."""
    if st.power_at is None:
        why = (
            f"{hot}: power limit lowered to {lever.factor:.0%} first "
            f"(degrade.power_limit_factor; the batch steps follow if still hot after {lever.hold_s:g} s)"
        )
        return replace(st, power_at=now), PowerCap(name, why, tuple(gpus), 0, seen), None
    if now - st.power_at < lever.hold_s:
        return st, None, None  # the lowered limit is given its time
    return None


def _not_now(
    name: str, what: str, st: InstanceActionState, s: Watch, held: Mapping[str, str] | None
) -> str | None:
    """Why a restart (``what``: its kind and step) is not done now, or None: the instance is held (this
    daemon cannot restart it on its own), or it had ``watch.max_actions_per_hour`` in the last hour."""
    if held and name in held:
        return f"{name}: {what} not done: {held[name]}"
    if len(st.actions_at) >= s.max_actions_per_hour:
        return (
            f"{name}: {what} deferred: {len(st.actions_at)} actions in the last hour "
            f"(watch.max_actions_per_hour {s.max_actions_per_hour})"
        )
    return None


# -- liveness ------------------------------------------------------------------------------------
# /health answers from vLLM's API server, which can say 200 while its engine makes no progress. Progress
# is judged from vLLM's own counters: requests running or waiting while the prompt and generation token
# counters stay unchanged for watch.stall_s is a hung engine. An idle server (nothing running or waiting)
# is never stalled, however long its counters stand; a reading not made decides nothing.


@dataclass(frozen=True)
class LivenessState:
    counters: float | None = None  # the counters' value at the last reading
    stalled_since: float | None = None  # work pending and the counters unchanged since
    acted: bool = False  # a restart was decided for this stall: not again until it moves or empties


def liveness_step(
    state: LivenessState, p: Progress | None, s: Watch, now: float
) -> tuple[LivenessState, str | None]:
    """Advance one instance's liveness by one reading; returns the new state and, once per stall, the
    reason to drain and restart it: work pending and no progress for ``watch.stall_s``. ``p`` None, or
    without work or counters: nothing is decided and nothing changes (a reading not made)."""
    if s.stall_s <= 0 or p is None or p.work is None or p.counters is None:
        return state, None
    if state.counters is None or p.counters != state.counters:  # progress (or a new process's counters)
        return LivenessState(p.counters, now if p.work > 0 else None), None
    if p.work <= 0:
        return LivenessState(p.counters), None  # idle: never stalled
    since = state.stalled_since if state.stalled_since is not None else now
    state = replace(state, stalled_since=since)
    if state.acted or now - since < s.stall_s:
        return state, None
    why = (
        f"no progress for {now - since:.0f} s with {p.work:.0f} request(s) running or waiting: vLLM's token "
        f"counters unchanged at {p.counters:.0f} (watch.stall_s {s.stall_s:g} s); /health may still answer"
    )
    return replace(state, acted=True), why


# -- slow decay (drift) --------------------------------------------------------------------------
# vLLM servers are reported to slow down over hours and to grow in host memory. Per instance, its first
# watch.drift_baseline_s of readings (after each start of its process) form a baseline: the mean TPOT in
# each load band (the requests running, in powers of two: a TPOT is compared only with one at comparable
# batch size) and the largest process RSS seen. Past the baseline, a reading whose TPOT is
# watch.drift_tpot_factor times its band's baseline, or whose RSS is watch.drift_rss_factor times its
# baseline, is drift; a reading made without drift ends it; a reading not made changes nothing. Drift that
# held watch.drift_hold_s is reported, and with watch.drift_recycle a planned recycle (drain, then the same
# settings) is decided once, never during a burst (requests over watch.recycle_max_load of max_num_seqs),
# never for two instances at once (the loop passes ``busy``: another instance's restart is queued or in
# flight, or another recycle was decided at this tick).

MIN_BAND_READINGS = 5  # readings of a band in the baseline before its TPOT is a baseline


def load_band(running: float) -> int:
    """The load band of a reading: 0 for at most one request running, then one per power of two."""
    n, band = max(1, int(running)), 0
    while n > 1:
        n //= 2
        band += 1
    return band


@dataclass(frozen=True)
class DriftState:
    started: float | None = None  # the first reading of this process
    bands: tuple[tuple[int, float, int], ...] = ()  # (band, TPOT sum, readings) in the baseline
    rss_base: float | None = None  # the largest RSS of the baseline
    tpot_since: float | None = None  # TPOT drift on every TPOT reading made (at a comparable load) since
    tpot_detail: str | None = None
    rss_since: float | None = None  # RSS drift on every RSS reading made since
    rss_detail: str | None = None
    acted: bool = False  # a recycle was decided for this process

    def baseline(self, band: int) -> float | None:
        for b, total, n in self.bands:
            if b == band and n >= MIN_BAND_READINGS:
                return total / n
        return None

    @property
    def since(self) -> float | None:
        """Since when some signal has drifted (the earliest of those drifting), or None."""
        held = [t for t in (self.tpot_since, self.rss_since) if t is not None]
        return min(held) if held else None

    @property
    def detail(self) -> str | None:
        return "; ".join(d for d in (self.tpot_detail, self.rss_detail) if d) or None


def drift_step(
    state: DriftState, r: DriftReading, s: Watch, now: float, busy: bool = False
) -> tuple[DriftState, str | None]:
    """Advance one instance's drift by one reading (pure). Returns the new state and, once per process and
    only with ``watch.drift_recycle``, the reason for a planned recycle. ``busy``: another instance is being
    restarted (or recycled) now: the recycle waits, so that never two go at once. Each signal (TPOT, RSS)
    drifts on its own readings: one not made (no tokens, a load band without a baseline, RSS not read)
    changes nothing of it."""
    if state.started is None:
        state = replace(state, started=now)
    assert state.started is not None
    if now - state.started < s.drift_baseline_s:  # still the baseline
        return _into_baseline(state, r), None
    state = _rss_drift(_tpot_drift(state, r, s, now), r, s, now)
    since = state.since
    if since is None or state.acted or not s.drift_recycle or busy or now - since < s.drift_hold_s:
        return state, None
    work = (r.running or 0.0) + (r.waiting or 0.0)
    if r.max_num_seqs is None or r.running is None or work > s.recycle_max_load * r.max_num_seqs:
        return state, None  # a burst (or a load not known): later, off-peak
    why = (
        f"slow decay for {now - since:.0f} s (watch.drift_hold_s {s.drift_hold_s:g} s): {state.detail}; "
        f"off-peak now ({work:.0f} request(s), at most {s.recycle_max_load:.0%} of max_num_seqs "
        f"{r.max_num_seqs}): a planned recycle (drain, then the same settings)"
    )
    return replace(state, acted=True), why


def _into_baseline(state: DriftState, r: DriftReading) -> DriftState:
    """A reading of the baseline: its TPOT added to its load band's sum (only a TPOT made, at a known
    load), its RSS to the largest seen."""
    bands = state.bands
    if r.tpot_s is not None and r.running is not None and r.tpot_s > 0:
        band = load_band(r.running)
        old = {b: (t, n) for b, t, n in bands}
        t, n = old.get(band, (0.0, 0))
        old[band] = (t + r.tpot_s, n + 1)
        bands = tuple(sorted((b, t, n) for b, (t, n) in old.items()))
    rss = state.rss_base
    if r.rss_bytes is not None:
        rss = r.rss_bytes if rss is None else max(rss, r.rss_bytes)
    return replace(state, bands=bands, rss_base=rss)


def _tpot_drift(state: DriftState, r: DriftReading, s: Watch, now: float) -> DriftState:
    """TPOT drift past the baseline: on (since its first such reading) while a TPOT is
    ``watch.drift_tpot_factor`` times its load band's baseline, off on one that is not; unchanged by a
    reading without a TPOT, a load or a baseline for its band."""
    base = state.baseline(load_band(r.running)) if r.running is not None else None
    if s.drift_tpot_factor <= 0 or r.tpot_s is None or r.running is None or base is None:
        return state
    if r.tpot_s < base * s.drift_tpot_factor:
        return replace(state, tpot_since=None, tpot_detail=None)
    return replace(
        state,
        tpot_since=state.tpot_since if state.tpot_since is not None else now,
        tpot_detail=(
            f"TPOT {r.tpot_s * 1000:.1f} ms is {r.tpot_s / base:.2f}x its baseline "
            f"{base * 1000:.1f} ms at {int(r.running)} request(s) running "
            f"(watch.drift_tpot_factor {s.drift_tpot_factor:g})"
        ),
    )


def _rss_drift(state: DriftState, r: DriftReading, s: Watch, now: float) -> DriftState:
    """RSS drift past the baseline: on while the RSS is ``watch.drift_rss_factor`` times the baseline's
    largest, off on one that is not; unchanged by a reading without an RSS (or without a baseline)."""
    if s.drift_rss_factor <= 0 or r.rss_bytes is None or not state.rss_base:
        return state
    if r.rss_bytes < state.rss_base * s.drift_rss_factor:
        return replace(state, rss_since=None, rss_detail=None)
    return replace(
        state,
        rss_since=state.rss_since if state.rss_since is not None else now,
        rss_detail=(
            f"RSS {r.rss_bytes / 2**20:.0f} MiB is {r.rss_bytes / state.rss_base:.2f}x its "
            f"baseline {state.rss_base / 2**20:.0f} MiB (watch.drift_rss_factor "
            f"{s.drift_rss_factor:g})"
        ),
    )


def drift_shown(state: DriftState | None, now: float) -> str | None:
    """The drift of an instance as reported (status, STATUS=, the exporter), or None."""
    if state is None or state.since is None or state.detail is None:
        return None
    return f"drifting for {now - state.since:.0f} s: {state.detail}"


# -- speculative decoding ------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecWindow:
    """Counter increases of one instance over the window (vLLM V1 names; see facts/vllm-metrics.md)."""

    drafts: float  # Δ spec_decode_num_drafts_total
    draft_tokens: float  # Δ spec_decode_num_draft_tokens_total
    accepted: float  # Δ spec_decode_num_accepted_tokens_total
    per_position: tuple[float, ...]  # Δ ..._per_pos_total{position=i}, i = 0..k-1

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.drafts if self.drafts > 0 else None

    def position_rates(self) -> tuple[float, ...]:
        """P(position i accepted), over all drafts (vLLM's own per-position formula)."""
        if self.drafts <= 0:
            return ()
        return tuple(min(1.0, p / self.drafts) for p in self.per_position)


def acceptance_health(w: SpecWindow | None, s: Watch) -> str | None:
    """A warning when the window's acceptance rate is outside the profile's band, else None."""
    if w is None or w.draft_tokens < s.min_draft_tokens or w.acceptance_rate is None:
        return None
    rate = w.acceptance_rate
    if rate < s.acceptance_low:
        return (
            f"acceptance {rate:.0%} below the profile's band {s.acceptance_low:.0%}-{s.acceptance_high:.0%} "
            f"({w.accepted:.0f} of {w.draft_tokens:.0f} draft tokens in the window): fewer proposals per step "
            "would waste less"
        )
    if rate > s.acceptance_high:
        return (
            f"acceptance {rate:.0%} above the profile's band {s.acceptance_low:.0%}-{s.acceptance_high:.0%} "
            f"({w.accepted:.0f} of {w.draft_tokens:.0f}): more proposals per step may pay"
        )
    return None


def expected_gain(rates: Sequence[float], k: int, draft_cost: float, verify_cost: float) -> float:
    """Tokens per unit of step cost with ``k`` proposals: (1 + Σ_{i<k} P(i accepted)) over
    (1 + k × (draft cost + verify cost)), relative to no speculation (1 token for 1 step)."""
    return (1 + sum(rates[:k])) / (1 + k * (draft_cost + verify_cost))


def extend_rates(rates: Sequence[float], k_max: int) -> tuple[float, ...]:
    """Per-position acceptance up to ``k_max``: observed positions as they are; beyond them the last
    observed conditional rate P(i | i-1) continues geometrically (never above it)."""
    out = list(rates)
    if not out:
        return ()
    cond = out[-1] / out[-2] if len(out) >= 2 and out[-2] > 0 else out[-1]
    cond = max(0.0, min(1.0, cond))
    while len(out) < k_max:
        out.append(out[-1] * cond)
    return tuple(out[:k_max])


@dataclass(frozen=True)
class KAdvice:
    k: int  # 0 = no speculation
    gain: float  # expected tokens per unit step cost vs no speculation
    current_k: int
    current_gain: float
    reason: str


def advise_k(
    w: SpecWindow | None,
    current_k: int,
    draft_cost: float,
    load: float,
    s: Watch,
    k_max: int = 8,
    adaptive: bool = False,
) -> KAdvice | None:
    """The k that maximises expected accepted tokens per unit of step cost for the observed
    per-position acceptance, or None without enough drafts.

    ``draft_cost``: one proposal's cost relative to a target step (draft/target size; ~0 for
    ngram). ``load``: the share of the batch in use (running / max_num_seqs): a verified proposal
    costs nothing extra at batch 1 (decoding is memory-bound) and about a token's compute at full
    batch, which is where a fixed k can lose to no speculation.
    """
    if w is None or w.draft_tokens < s.min_draft_tokens:
        return None
    observed = w.position_rates()
    if not observed:
        return None
    rates = extend_rates(observed, max(k_max, len(observed)))
    verify = max(0.0, min(1.0, load))
    gains = {k: expected_gain(rates, k, draft_cost, verify) for k in range(0, k_max + 1)}
    best = max(gains, key=lambda k: (round(gains[k], 6), -k))
    cur = gains.get(current_k, expected_gain(rates, current_k, draft_cost, verify))
    mean_len = w.mean_acceptance_length or 1.0
    if best == 0:
        why = (
            f"no speculation: at {load:.0%} batch load every k loses to none (best k={max(gains, key=gains.__getitem__)} "
            f"{max(gains.values()):.2f}x; acceptance per position {_fmt(observed)})"
        )
    else:
        why = (
            f"k={best}: {gains[best]:.2f}x tokens per step cost vs {cur:.2f}x at k={current_k} "
            f"(acceptance per position {_fmt(observed)}, mean acceptance length {mean_len:.2f}, "
            f"draft cost {draft_cost:.2f}, batch load {load:.0%})"
        )
    if adaptive:
        why += (
            "; this vLLM chooses k by batch size itself (num_speculative_tokens_per_batch_size): the advice "
            "is for the band that covers the observed load"
        )
    return KAdvice(best, round(gains[best], 4), current_k, round(cur, 4), why)


def _fmt(rates: Sequence[float]) -> str:
    return "[" + ", ".join(f"{r:.2f}" for r in rates) + "]"


# -- hardware faults -----------------------------------------------------------------------------
# NVML's fault signals, apart from heat: an uncorrectable ECC error (volatile count, since the driver
# loaded), retired pages or remapped rows waiting for a GPU reset, a row remap that failed, an XID critical
# error NVIDIA's XID catalogue says needs a reset or the node drained, a GPU lost from the bus. Any of them
# is fatal for the GPU: the instances on it are drained and not restarted there (a restart on a card that
# corrupts memory or is gone serves wrong answers or nothing); it stays so until the daemon restarts (after
# the GPU was reset or replaced). Other XIDs (an application's own fault: 13, 31, 43, ...) are noted only.

# XID -> what NVIDIA's XID catalogue says of it; each needs a GPU reset (or more) before the card is trusted.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded (reset to apply)",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}


@dataclass(frozen=True)
class FaultState:
    """Per GPU: the fatal faults seen (sticky: a reset of the GPU and a restart of the daemon clear them),
    since when, and the faults noted but not acted on."""

    fatal: tuple[str, ...] = ()
    since: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def faulted(self) -> bool:
        return bool(self.fatal)


def read_faults(r: GpuReading) -> tuple[list[str], list[str]]:
    """The fatal faults and the noted ones in one reading (pure)."""
    fatal: list[str] = []
    notes: list[str] = []
    if r.status == "lost":
        fatal.append(f"gpu_lost: {r.error or 'NVML says the GPU is lost'} (fallen off the bus or hung)")
    if r.ecc_uncorrected:
        fatal.append(
            f"ecc_uncorrectable: {r.ecc_uncorrected} uncorrectable ECC error(s) since the driver loaded"
        )
    if r.row_remap_failure:
        fatal.append(
            "row_remap_failure: a row remapping failed (the card's spare rows are spent: replace it)"
        )
    if r.remapped_rows_pending:
        fatal.append("row_remap_pending: remapped rows wait for a GPU reset")
    if r.retired_pages_pending:
        fatal.append("retired_pages_pending: retired pages wait for a GPU reset")
    for x in dict.fromkeys(r.xids):
        if x in FATAL_XIDS:
            fatal.append(f"xid_{x}: XID {x} ({FATAL_XIDS[x]})")
        else:
            notes.append(f"XID {x} (an application or driver fault: noted, not acted on)")
    return fatal, notes


def fault_step(state: FaultState, r: GpuReading, now: float) -> tuple[FaultState, str | None]:
    """Advance one GPU's fault state by one reading; returns the new state and, when a new fatal fault
    appeared, a line that says so (else None). Faults never clear within a run."""
    fatal, notes = read_faults(r)
    new = tuple(f for f in fatal if f not in state.fatal)
    allnotes = (*state.notes, *(n for n in notes if n not in state.notes))
    if not new:
        return (replace(state, notes=allnotes) if allnotes != state.notes else state), None
    st = FaultState((*state.fatal, *new), state.since if state.since is not None else now, allnotes)
    return st, f"GPU {r.index} hardware fault: {'; '.join(new)}"


def fault_kinds(state: FaultState) -> tuple[str, ...]:
    """The kind of each fatal fault (``ecc_uncorrectable``, ``xid_79``, ``gpu_lost``...): the exporter's label."""
    return tuple(f.split(":", 1)[0] for f in state.fatal)


def decide_drains(
    instances: Mapping[str, Sequence[int]],
    faults: Mapping[int, FaultState],
    drained: Mapping[str, str],
    readings: Mapping[int, GpuReading] | None = None,
) -> list[Drain]:
    """A drain for each instance not yet drained that runs on a GPU with a fatal fault (pure): it is
    stopped (SIGTERM, vLLM's own drain) and not restarted there. ``readings``: this tick's, the evidence."""
    readings = readings or {}
    out: list[Drain] = []
    for name, gpus in instances.items():
        if name in drained:
            continue
        bad = [g for g in gpus if g in faults and faults[g].faulted]
        if not bad:
            continue
        why = "; ".join(f"GPU {g}: {', '.join(faults[g].fatal)}" for g in bad)
        out.append(
            Drain(
                name,
                f"{why}: not restarted there (reset or replace the GPU, then restart the daemon)",
                tuple(gpus),
                0,
                tuple(readings[g] for g in bad if g in readings),
            )
        )
    return out
