"""The sections of settings launch, the supervisor, the daemon, ``bench`` and ``verify`` read:
``logs``, ``supervise``, ``watch``, ``degrade``, ``bench`` and ``verify``. Each field is one
setting's declaration and its one default (sizes in bytes)."""

from __future__ import annotations

from .section import Section, section, setting

MiB = 2**20


@section
class Logs(Section):
    """``logs.*``: where the instances' logs go and how much of them is kept."""

    dir: str | None = setting(
        "str",
        "per-instance log directories go under this (default: tmpfs /dev/shm/hwprofile)",
        nullable=True,
        default=None,
    )
    max_bytes: int = setting(
        "size", "cap on each instance's logs (tmpfs is RAM); oldest file dropped first", default=64 * MiB
    )
    files: int = setting(
        "int", "log files kept per instance (the cap is split among them)", 2, 100, default=4
    )
    stdout: bool = setting(
        "bool",
        "also copy every line of the instances' output to hwprofile's stdout, prefixed with the "
        "instance's name (a container's log collection; the log files are kept as well)",
        default=False,
    )


@section
class Supervise(Section):
    """``supervise.*``: starting and restarting the instances."""

    ready_timeout: float = setting(
        "float", "seconds to wait for /health before a start counts as failed", 5, 86400, default=900.0
    )
    max_restarts: int = setting(
        "int",
        "restarts after failures within supervise.restart_window_s before giving up (systemd's "
        "StartLimitBurst)",
        0,
        1000,
        default=5,
    )
    restart_window_s: float = setting(
        "float",
        "seconds in which failures are counted against supervise.max_restarts (systemd's "
        "StartLimitIntervalSec): older ones no longer count",
        1,
        10**7,
        default=600.0,
    )
    retry_failed_s: float = setting(
        "float",
        "seconds after giving up before a failed instance is tried again, doubling with each give-up "
        "in a row up to supervise.retry_failed_max_s (0: never, the instance stays failed)",
        0,
        86400,
        default=300.0,
    )
    retry_failed_max_s: float = setting(
        "float",
        "longest wait before a failed instance is tried again",
        1,
        10**6,
        default=3600.0,
    )
    backoff_initial: float = setting(
        "float", "first restart delay in seconds (doubles each time)", 0.1, 3600, default=2.0
    )
    backoff_max: float = setting("float", "longest restart delay in seconds", 0.1, 86400, default=60.0)
    unhealthy_s: float = setting(
        "float",
        "seconds a ready instance may fail /health (no answer, or an error status) before it is "
        "restarted: a hung server, or one whose engine died behind an API server still up",
        2,
        3600,
        default=30.0,
    )
    stop_margin: float = setting(
        "float",
        "seconds beyond server.shutdown_timeout (the drain) before what is left of an instance is "
        "SIGKILLed, when it is stopped or when its supervisor died",
        0,
        3600,
        default=10.0,
    )
    gpu_free_timeout: float = setting(
        "float",
        "seconds a start of a GPU instance waits at most for its GPUs' memory to be back (used "
        "memory at its level before the first start, free memory at least what vLLM asks): vLLM measures "
        "free memory once, and a start onto memory still being released gets a smaller KV cache; "
        "after this it starts anyway, with a warning; 0: look once, never wait",
        0,
        3600,
        default=60.0,
    )
    pin_kv_pool: bool = setting(
        "bool",
        "record the KV cache pool vLLM measures at each profiled start of a GPU instance (per host, "
        "GPUs, release, model and settings) and pin it in bytes (--kv-cache-memory-bytes) on later plans of "
        "the same instance: the profiled pool varies by ~1 GiB between starts and is smaller on a cold "
        "compile cache",
        default=False,
    )
    link_check: bool = setting(
        "bool",
        "before the first start of an instance with tensor_parallel_size > 1 on GPUs whose links were "
        "never proven (no interconnect check recorded for its group), run the check (`hwprofile doctor "
        "--interconnect`: an all-reduce with P2P on and off) and record it: a group that is right only without "
        "P2P starts with NCCL_P2P_DISABLE=1 and without vLLM's custom all-reduce, one wrong or hung in every "
        "mode is refused (launch and daemon --skip-link-check: this once)",
        default=True,
    )
    link_check_deadline_s: float = setting(
        "float",
        "seconds one run of the automatic interconnect check may take before its processes are killed "
        "and the run counts as a hang",
        5,
        3600,
        default=120.0,
    )


@section
class Watch(Section):
    """``watch.*``: what the daemon samples, and its thermal and acceptance thresholds."""

    interval: float = setting("float", "seconds between telemetry samples", 0.1, 60, default=1.0)
    window_s: float = setting(
        "float", "window of counter rates, acceptance and latency quantiles (seconds)", 5, 3600, default=60.0
    )
    warm_c: float = setting("float", "GPU temperature at which a card is warm (°C)", 20, 120, default=75.0)
    hot_c: float = setting(
        "float", "GPU temperature at which a card is hot: its instances degrade (°C)", 20, 120, default=83.0
    )
    critical_c: float = setting(
        "float", "GPU temperature at which a card is critical: a deeper degrade (°C)", 20, 125, default=88.0
    )
    warm_margin_c: float = setting(
        "float", "warm when the card is this close to its own slowdown threshold (°C)", 0, 60, default=12.0
    )
    hot_margin_c: float = setting(
        "float", "hot when the card is this close to its own slowdown threshold (°C)", 0, 60, default=6.0
    )
    critical_margin_c: float = setting(
        "float", "critical when the card is this close to its own slowdown threshold (°C)", 0, 60, default=2.0
    )
    hysteresis_c: float = setting(
        "float", "degrees below a threshold before a state is left (°C)", 0, 30, default=3.0
    )
    dwell_s: float = setting(
        "float",
        "seconds a new thermal state must hold before it counts (one spike never acts)",
        0,
        600,
        default=3.0,
    )
    throttle_s: float = setting(
        "float",
        "seconds of thermal clock-event reasons that count as hot whatever the temperature",
        0,
        600,
        default=5.0,
    )
    recover_s: float = setting(
        "float",
        "seconds below hot minus the hysteresis before the full profile comes back",
        0,
        86400,
        default=300.0,
    )
    stall_s: float = setting(
        "float",
        "seconds an instance may hold requests (running or waiting) while vLLM's token counters stay "
        "unchanged before it is drained and restarted: an engine hung behind a /health that still answers 200 (0: off; "
        "keep it above the longest prefill of one prompt)",
        0,
        86400,
        default=120.0,
    )
    unknown_s: float = setting(
        "float",
        "seconds a GPU without a temperature reading keeps its last known state; then it is unknown (never "
        "cool: no recover is decided on a reading that was not made)",
        0,
        3600,
        default=15.0,
    )
    max_actions_per_hour: int = setting(
        "int", "restarts for degrade or recover per instance and hour", 0, 3600, default=6
    )
    drift_baseline_s: float = setting(
        "float",
        "seconds of readings after an instance (re)starts that form its baseline of TPOT (per load band) "
        "and process RSS, against which slow decay is judged",
        60,
        86400,
        default=1800.0,
    )
    drift_tpot_factor: float = setting(
        "float",
        "TPOT at comparable load this many times its baseline is drift (0: TPOT not judged)",
        0,
        100,
        default=1.5,
    )
    drift_rss_factor: float = setting(
        "float",
        "process RSS this many times its baseline is drift (0: RSS not judged)",
        0,
        100,
        default=1.5,
    )
    drift_hold_s: float = setting(
        "float",
        "seconds drift must hold, on readings made, before a planned recycle is decided",
        0,
        86400,
        default=1800.0,
    )
    drift_recycle: bool = setting(
        "bool",
        "recycle a drifting instance (drain, then the same settings; one at a time, off-peak); "
        "otherwise drift is reported only",
        default=False,
    )
    recycle_max_load: float = setting(
        "float",
        "a recycle waits while the instance's requests (running and waiting) exceed this share of "
        "its max_num_seqs: never during a burst",
        0,
        1,
        default=0.25,
    )
    acceptance_low: float = setting(
        "float", "speculative acceptance rate below which the daemon warns", 0, 1, default=0.65
    )
    acceptance_high: float = setting(
        "float",
        "speculative acceptance rate above which the daemon says more proposals may pay",
        0,
        1,
        default=0.85,
    )
    min_draft_tokens: int = setting(
        "int", "draft tokens in the window before acceptance is judged", 1, 10**9, default=200
    )
    apply_k_advice: bool = setting(
        "bool", "use the advised k at the next restart (otherwise advice only)", default=False
    )
    metrics_port: int = setting(
        "int",
        "port of hwprofile's own Prometheus metrics, /health and /livez (0: off)",
        0,
        65535,
        default=9464,
    )
    metrics_host: str = setting(
        "str",
        "address of the metrics port: 127.0.0.1, or 0.0.0.0 in a pod (the kubelet's probes and "
        "Prometheus reach it by the pod's IP)",
        default="127.0.0.1",
        pattern=r"[A-Za-z0-9.:_\[\]-]+",
        pattern_doc="an IP address or host name (0.0.0.0 for every interface)",
    )
    unready_s: float = setting(
        "float",
        "seconds the metrics port's /health answers 503 before a degrade, recover or reload drains "
        "an instance, so that a load balancer stops sending first (in a pod: the readiness probe's "
        "periodSeconds x failureThreshold)",
        0,
        600,
        default=0.0,
    )


@section
class Degrade(Section):
    """``degrade.*``: what one degrade step takes off a hot GPU's instances."""

    max_num_seqs_factor: float = setting(
        "float", "max_num_seqs multiplied by this per degrade step (seed: 256 -> 192)", 0.05, 1, default=0.75
    )
    max_num_batched_tokens_factor: float = setting(
        "float", "max_num_batched_tokens multiplied by this per degrade step", 0.05, 1, default=0.75
    )
    num_speculative_tokens_step: int = setting(
        "int", "proposals per step taken off per degrade step (never below 1)", 0, 16, default=1
    )
    power_limit_factor: float = setting(
        "float",
        "a hot card's power limit is first lowered to this share of its limit, before the batch "
        "steps (NVML, as root; never below the card's minimum; restored on recover and on exit; 0: off)",
        0,
        1,
        default=0.85,
    )
    power_limit_hold_s: float = setting(
        "float",
        "seconds a lowered power limit is given to cool the card before the batch steps follow",
        0,
        3600,
        default=60.0,
    )


@section
class Bench(Section):
    """``bench.*``: the seed workload and sweep of ``hwprofile bench``."""

    concurrency: int = setting(
        "int", "concurrent requests of the seed workload (seed: 16)", 1, 65_536, default=16
    )
    input_len: int = setting(
        "int", "prompt tokens per request of the seed workload", 1, 1_048_576, default=512
    )
    output_len: int = setting(
        "int", "output tokens per request of the seed workload", 1, 1_048_576, default=256
    )
    num_prompts: int = setting(
        "int", "requests per benchmark point (at least the concurrency is sent)", 1, 10**6, default=64
    )
    sweep_max: int = setting(
        "int", "highest concurrency of the saturation sweep (powers of two from 1)", 1, 65_536, default=64
    )
    ttft_p99_target_ms: float = setting(
        "float",
        "p99 time to first token the sweep's knee is judged against (seed: 120 ms)",
        1,
        10**7,
        default=120.0,
    )
    rounds: int = setting("int", "alternating rounds per plan of --compare", 1, 100, default=3)
    dataset: str = setting(
        "choice",
        "the requests' prompts: random tokens (bench.input_len each), or real prompts (hwprofile's "
        "shipped set of written questions and tasks, data/bench_prompts.json, ShareGPT format; their own "
        "lengths); auto: real prompts wherever a plan speculates (a draft's acceptance on random tokens says "
        "nothing about real traffic), random tokens otherwise",
        choices=("auto", "random", "prompts"),
        default="auto",
    )


@section
class Verify(Section):
    """``verify.*``: how close a tuned plan's answers must stay to the baseline's."""

    min_similarity: float = setting(
        "float",
        "similarity to the baseline a tuned plan's greedy answers must reach (seed: 0.992)",
        0,
        1,
        default=0.992,
    )
    max_tokens: int = setting("int", "tokens generated per reference prompt", 1, 65_536, default=128)
