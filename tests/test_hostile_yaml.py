"""Hostile configuration through the real CLI: every case is ``hwprofile plan`` in a subprocess with
a temporary config root and a saved snapshot; each must exit 2 with a message naming the file and
line (or the key, flag or variable), no traceback, nothing on stdout and nothing written. The FIFO
and /dev/zero cases run under a timeout: a hang fails the test instead of stalling the suite.
Then hypothesis fuzzes the YAML settings loader: nothing but ConfigError ever comes out."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import inproc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwprofile.config import ConfigError

ALIAS_BOMB = (  # 372 bytes of YAML that expand to 10^9 strings
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
    "i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"
)
FIFO, DEV_ZERO, DIRECTORY = object(), object(), object()  # special entries instead of file text
OV = "overrides.d/a.yaml"


def rule(when: str, profile: str = "generic-small") -> str:
    return f"rules:\n  - profile: {profile}\n    why: site\n    when: {when}\n"


# (id, {relative path: text | bytes | special}, extra argv, [expected substrings], extra env)
Case = tuple[str, dict[str, Any], list[str], list[str], dict[str, str]]
CASES: list[Case] = [
    # -- YAML structure ------------------------------------------------------------------------
    (
        "dup-key",
        {OV: "engine:\n  max_num_seqs: 4\n  max_num_seqs: 8\n"},
        [],
        ["a.yaml:3: duplicate key 'engine.max_num_seqs' (first at line 2)"],
        {},
    ),
    (
        "dup-section",
        {OV: "engine:\n  max_num_seqs: 4\nlayout:\n  replicas: 1\nengine:\n  dtype: auto\n"},
        [],
        ["a.yaml:5: duplicate key 'engine' (first at line 1)"],
        {},
    ),
    (
        "dup-top-scalar",
        {OV: "model: a\nmodel: b\n"},
        [],
        ["a.yaml:2: duplicate key 'model' (first at line 1)"],
        {},
    ),
    (
        "dup-flow",
        {OV: "engine: {max_num_seqs: 1, max_num_seqs: 2}\n"},
        [],
        ["a.yaml:1: duplicate key 'engine.max_num_seqs'"],
        {},
    ),
    (
        "dup-in-profile",
        {"profiles/x.yaml": "extends: base\nextends: base\n"},
        [],
        ["x.yaml:2: duplicate key 'extends' (first at line 1)"],
        {},
    ),
    (
        "dup-in-rules",
        {"rules.d/a.yaml": "rules:\n  - profile: base\n    profile: base\n"},
        [],
        ["a.yaml:3: duplicate key 'rules.0.profile' (first at line 2)"],
        {},
    ),
    ("alias-bomb", {OV: ALIAS_BOMB}, [], ["a.yaml:2: YAML anchors and aliases"], {}),
    (
        "alias-scalar",
        {OV: "server:\n  host: &h 127.0.0.1\nmodel: *h\n"},
        [],
        ["a.yaml:3: YAML anchors and aliases"],
        {},
    ),
    ("alias-recursive", {OV: "a: &a [*a]\n"}, [], ["a.yaml:1: YAML anchors and aliases"], {}),
    ("alias-undefined", {OV: "model: *nowhere\n"}, [], ["a.yaml:1: invalid YAML"], {}),
    (
        "merge-key",
        {OV: "engine:\n  <<: {max_num_seqs: 4}\n"},
        [],
        ["a.yaml:2: YAML merge keys (<<) are not allowed"],
        {},
    ),
    (
        "alias-in-rules",
        {"rules.d/a.yaml": "rules:\n  - &r {profile: base}\n  - *r\n"},
        [],
        ["a.yaml:3: YAML anchors and aliases"],
        {},
    ),
    (
        "alias-in-profile",
        {"profiles/x.yaml": "engine: &e {max_num_seqs: 4}\nlayout: *e\n"},
        [],
        ["x.yaml:2: YAML anchors and aliases"],
        {},
    ),
    (
        "deep-nesting",
        {OV: "engine: " + "[" * 40 + "]" * 40 + "\n"},
        [],
        ["a.yaml:1: nested more than 32 levels deep"],
        {},
    ),
    ("tab-indent", {OV: "engine:\n\tmax_num_seqs: 4\n"}, [], ["a.yaml:2: invalid YAML"], {}),
    ("not-utf8", {OV: b"model: caf\xe9\n"}, [], ["a.yaml: not UTF-8 text (byte 10)"], {}),
    (
        "nul-byte",
        {OV: "model: a\x00b\n"},
        [],
        ["a.yaml: invalid YAML", "control characters are not allowed"],
        {},
    ),
    ("two-documents", {OV: "model: a\n---\nmodel: b\n"}, [], ["a.yaml:2: invalid YAML"], {}),
    (
        "top-level-list",
        {OV: "- engine\n- layout\n"},
        [],
        ["a.yaml", "expected a mapping of settings, got list"],
        {},
    ),
    ("complex-key", {OV: "? [engine, layout]\n: 1\n"}, [], ["a.yaml:1: a key must be a plain name"], {}),
    (
        "python-tag",
        {OV: 'model: !!python/object/apply:os.system ["touch pwned"]\n'},
        [],
        ["a.yaml:1: invalid YAML: could not determine a constructor"],
        {},
    ),
    (
        "bad-timestamp",
        {OV: "engine:\n  max_num_seqs: 4\nmodel: 2024-13-45\n"},
        [],
        ["a.yaml:3: invalid YAML value: month must be in 1..12"],
        {},
    ),
    (
        "huge-int",
        {OV: "engine:\n  max_num_seqs: " + "9" * 5000 + "\n"},
        [],
        ["a.yaml:2: invalid YAML value"],
        {},
    ),
    (
        "oversized",
        {OV: "# padding\n" * 120_000},
        [],
        ["a.yaml: 1200000 bytes; configuration files are limited to 1048576 bytes"],
        {},
    ),
    ("fifo", {OV: FIFO}, [], ["a.yaml: not a regular file (a FIFO)"], {}),
    ("dev-zero-link", {OV: DEV_ZERO}, [], ["a.yaml: not a regular file (a character device)"], {}),
    ("dev-zero-overrides", {}, ["--overrides", "/dev/zero"], ["--overrides /dev/zero"], {}),
    ("fifo-overrides", {"x/f.yaml": FIFO}, ["--overrides", "{root}/x/f.yaml"], ["f.yaml"], {}),
    ("directory-named-yaml", {OV: DIRECTORY}, [], ["a.yaml: not a regular file (a directory)"], {}),
    (
        "overrides.d-is-file",
        {"overrides.d": "engine: {}\n"},
        [],
        ["overrides.d: not a directory (it should hold the overrides *.yaml files)"],
        {},
    ),
    ("rules.d-is-file", {"rules.d": "rules: []\n"}, [], ["rules.d: not a directory"], {}),
    ("profiles-is-file", {"profiles": "x\n"}, [], ["profiles: not a directory"], {}),
    (
        "yml-overrides",
        {"overrides.d/a.yml": "engine:\n  max_num_seqs: 4\n"},
        [],
        ["a.yml: only *.yaml files are read here; rename it to a.yaml"],
        {},
    ),
    (
        "yml-rules",
        {"rules.d/10-site.yml": rule("{gpu_count: 1}")},
        [],
        ["10-site.yml: only *.yaml files are read here"],
        {},
    ),
    (
        "yml-profile",
        {"profiles/site.yml": "extends: base\n"},
        [],
        ["site.yml: only *.yaml files are read here"],
        {},
    ),
    (
        "missing-config-root",
        {},
        ["--config-root", "{root}/nope"],
        ["--config-root {root}/nope: no such directory"],
        {},
    ),
    (
        "config-root-is-file",
        {"file": "x"},
        ["--config-root", "{root}/file"],
        ["--config-root {root}/file: not a directory"],
        {},
    ),
    # -- numbers -------------------------------------------------------------------------------
    (
        "nan-float",
        {OV: "engine:\n  gpu_memory_utilization: .nan\n"},
        [],
        ["a.yaml:2: engine.gpu_memory_utilization: expected a finite number, got nan"],
        {},
    ),
    (
        "inf-float",
        {OV: "memory:\n  activation_factor: .inf\n"},
        [],
        ["a.yaml:2: memory.activation_factor: expected a finite number"],
        {},
    ),
    (
        "minus-inf",
        {OV: "speculative:\n  assumed_acceptance: -.inf\n"},
        [],
        ["a.yaml:2: speculative.assumed_acceptance: expected a finite number"],
        {},
    ),
    (
        "nan-int",
        {OV: "engine:\n  max_num_seqs: .nan\n"},
        [],
        ["a.yaml:2: engine.max_num_seqs: expected a finite number"],
        {},
    ),
    (
        "nan-set",
        {},
        ["--set", "engine.gpu_memory_utilization=nan"],
        ["--set engine.gpu_memory_utilization=nan: engine.gpu_memory_utilization: expected a finite number"],
        {},
    ),
    (
        "inf-env",
        {},
        [],
        ["HWPROFILE_MEMORY__ACTIVATION_FACTOR", "expected a finite number"],
        {"HWPROFILE_MEMORY__ACTIVATION_FACTOR": "inf"},
    ),
    (
        "nan-ready-timeout",
        {OV: "supervise:\n  ready_timeout: .NaN\n"},
        [],
        ["a.yaml:2: supervise.ready_timeout: expected a finite number"],
        {},
    ),
    (
        "huge-size",
        {OV: "memory:\n  margin_bytes: 99999999999TiB\n"},
        [],
        ["a.yaml:2: memory.margin_bytes", "too large a size"],
        {},
    ),
    (
        "float-overflow-size",
        {OV: "memory:\n  margin_bytes: " + "9" * 400 + "GiB\n"},
        [],
        ["a.yaml:2: memory.margin_bytes", "too large a size"],
        {},
    ),
    (
        "bool-in-k-table",
        {OV: "speculative:\n  by_batch_size: [[true, null, 3]]\n"},
        [],
        ["a.yaml:2: speculative.by_batch_size", "not booleans"],
        {},
    ),
    (
        "port-too-high",
        {OV: "server:\n  port: 65536\n"},
        [],
        ["a.yaml:2: server.port: 65536 is out of range [1, 65535]"],
        {},
    ),
    (
        "port-zero",
        {},
        ["--set", "server.port=0"],
        ["--set server.port=0: server.port: 0 is out of range [1, 65535]"],
        {},
    ),
    (
        "zero-seqs",
        {},
        ["--set", "engine.max_num_seqs=0"],
        ["engine.max_num_seqs: 0 is out of range [1, 65536]"],
        {},
    ),
    # -- merge keys ----------------------------------------------------------------------------
    (
        "replace-text-no",
        {OV: 'engine:\n  _replace: "no"\n'},
        [],
        ["a.yaml:2: engine._replace: expected true or false (unquoted), got 'no'"],
        {},
    ),
    (
        "replace-int",
        {OV: "speculative:\n  _replace: 1\n"},
        [],
        ["a.yaml:2: speculative._replace: expected true or false"],
        {},
    ),
    (
        "drop-unknown",
        {OV: "engine:\n  _drop: [max_num_seq]\n"},
        [],
        ["a.yaml:2: engine._drop: cannot drop unknown key 'max_num_seq' (did you mean 'max_num_seqs'?)"],
        {},
    ),
    (
        "drop-not-list",
        {OV: "engine:\n  _drop: {a: 1}\n"},
        [],
        ["a.yaml:2: engine._drop: expected a list of keys to remove"],
        {},
    ),
    (
        "drop-number",
        {OV: "layout:\n  _drop: [1]\n"},
        [],
        ["a.yaml:2: layout._drop: expected a list of keys"],
        {},
    ),
    (
        "replace-in-profile",
        {"profiles/x.yaml": 'extends: base\nspeculative:\n  _replace: "false"\n'},
        [],
        ["x.yaml:3: speculative._replace: expected true or false"],
        {},
    ),
    # -- text that reaches rendered files --------------------------------------------------------
    (
        "user-newline",
        {OV: 'server:\n  user: "root\\nExecStartPre=/bin/sh -c id"\n'},
        [],
        ["a.yaml:2: server.user", "control character '\\n'"],
        {},
    ),
    (
        "served-name-cr",
        {OV: 'server:\n  served_model_name: "a\\rb"\n'},
        [],
        ["a.yaml:2: server.served_model_name", "control character '\\r'"],
        {},
    ),
    (
        "served-name-u2028",
        {OV: 'server:\n  served_model_name: "a\\u2028b"\n'},
        [],
        ["a.yaml:2: server.served_model_name", "control character"],
        {},
    ),
    (
        "api-key-env-space",
        {OV: "server:\n  api_key_env: MY KEY\n"},
        [],
        ["a.yaml:2: server.api_key_env: 'MY KEY' is not an environment variable name"],
        {},
    ),
    (
        "api-key-env-digit",
        {OV: "server:\n  api_key_env: 1KEY\n"},
        [],
        ["a.yaml:2: server.api_key_env: '1KEY' is not an environment variable name"],
        {},
    ),
    (
        "api-key-env-dollar",
        {},
        ["--set", "server.api_key_env=$(id)"],
        ["--set server.api_key_env=$(id): server.api_key_env", "not an environment variable name"],
        {},
    ),
    (
        "api-key-env-newline",
        {OV: 'server:\n  api_key_env: "KEY\\nX=1"\n'},
        [],
        ["a.yaml:2: server.api_key_env", "control character"],
        {},
    ),
    (
        "extra-args-newline",
        {OV: 'server:\n  extra_args: ["--foo", "a\\nb"]\n'},
        [],
        ["a.yaml:2: server.extra_args", "control character '\\n'"],
        {},
    ),
    (
        "extra-args-escape",
        {OV: 'server:\n  extra_args: "--foo \\e[31m"\n'},
        [],
        ["a.yaml:2: server.extra_args", "control character '\\x1b'"],
        {},
    ),
    (
        "extra-args-unclosed-quote",
        {OV: 'server:\n  extra_args: "--foo \'bar"\n'},
        [],
        ["a.yaml:2: server.extra_args: No closing quotation"],
        {},
    ),
    (
        "extra-args-bool",
        {OV: "server:\n  extra_args: [true]\n"},
        [],
        ["a.yaml:2: server.extra_args: expected a list of strings"],
        {},
    ),
    (
        "logs-dir-nul",
        {OV: 'logs:\n  dir: "/tmp/a\\0b"\n'},
        [],
        ["a.yaml:2: logs.dir", "control character '\\x00'"],
        {},
    ),
    (
        "vllm-command-tab",
        {OV: 'server:\n  vllm_command: "vllm\\tserve"\n'},
        [],
        ["a.yaml:2: server.vllm_command", "control character '\\t'"],
        {},
    ),
    ("model-newline", {OV: 'model: "Qwen/Qwen3-8B\\n"\n'}, [], ["a.yaml:1: model", "control character"], {}),
    (
        "host-empty",
        {OV: 'server:\n  host: ""\n'},
        [],
        ["a.yaml:2: server.host: '' is not an address or host name without spaces"],
        {},
    ),
    (
        "user-set-newline",
        {},
        ["--set", "server.user=root\nExecStartPre=/bin/sh"],
        ["--set server.user: 'root\\nExecStartPre=/bin/sh' holds the control character '\\n'"],
        {},
    ),
    (
        "served-name-env-newline",
        {},
        [],
        ["environment HWPROFILE_SERVER__SERVED_MODEL_NAME", "control character"],
        {"HWPROFILE_SERVER__SERVED_MODEL_NAME": "a\nb"},
    ),
    (
        "description-escape",
        {"profiles/x.yaml": 'description: "\\e[2J"\n'},
        [],
        ["x.yaml:1: description", "control character '\\x1b'"],
        {},
    ),
    (
        "extends-newline",
        {"profiles/x.yaml": 'extends: "base\\n"\n'},
        [],
        ["x.yaml:1: extends", "control character"],
        {},
    ),
    # -- per-instance ports --------------------------------------------------------------------
    (
        "port-65535-two-instances",
        {},
        ["--set", "server.port=65535", "--host", "a800"],
        [
            "server.port 65535 (cli --set server.port=65535): 2 instances take ports 65535-65536",
            "at most 65534",
        ],
        {},
    ),
    (
        "port-file-two-instances",
        {OV: "server:\n  port: 65535\n"},
        ["--host", "a800"],
        ["server.port 65535 (overrides.d ", "a.yaml:2): 2 instances"],
        {},
    ),
    # -- rules ---------------------------------------------------------------------------------
    (
        "rule-bad-regex",
        {"rules.d/a.yaml": rule('{gpu_name: "RTX ("}')},
        [],
        ["a.yaml:4: rule for 'generic-small': gpu_name: invalid regular expression 'RTX ('"],
        {},
    ),
    (
        "rule-regex-not-text",
        {"rules.d/a.yaml": rule("{gpu_name: [RTX]}")},
        [],
        ["a.yaml:4: rule for 'generic-small': gpu_name: expected a regular expression"],
        {},
    ),
    (
        "rule-regex-empty",
        {"rules.d/a.yaml": rule('{gpu_name: ""}')},
        [],
        ["a.yaml:4:", "gpu_name: expected a regular expression"],
        {},
    ),
    (
        "rule-cc-text",
        {"rules.d/a.yaml": rule("{compute_capability: {min: nine}}")},
        [],
        ["a.yaml:4:", "compute_capability: expected a compute capability like \"8.9\" or 9, got 'nine'"],
        {},
    ),
    (
        "rule-cc-three-parts",
        {"rules.d/a.yaml": rule("{compute_capability: {max: 9.0.1}}")},
        [],
        ["a.yaml:4:", "compute_capability: expected a compute capability"],
        {},
    ),
    (
        "rule-cc-min-above-max",
        {"rules.d/a.yaml": rule("{compute_capability: {min: 9, max: 8.0}}")},
        [],
        ["a.yaml:4:", "min 9 is above max 8.0"],
        {},
    ),
    (
        "rule-nvlink-text",
        {"rules.d/a.yaml": rule('{nvlink: "false"}')},
        [],
        ["a.yaml:4: rule for 'generic-small': nvlink: expected true or false (unquoted), got 'false'"],
        {},
    ),
    (
        "rule-p2p-yes-text",
        {"rules.d/a.yaml": rule('{p2p: "yes"}')},
        [],
        ["a.yaml:4:", "p2p: expected true or false"],
        {},
    ),
    (
        "rule-homogeneous-int",
        {"rules.d/a.yaml": rule("{homogeneous: 1}")},
        [],
        ["a.yaml:4:", "homogeneous: expected true or false"],
        {},
    ),
    (
        "rule-count-text",
        {"rules.d/a.yaml": rule('{gpu_count: "2"}')},
        [],
        ["a.yaml:4:", "gpu_count: expected a whole number"],
        {},
    ),
    (
        "rule-count-bool",
        {"rules.d/a.yaml": rule("{gpu_count: true}")},
        [],
        ["a.yaml:4:", "gpu_count: expected a whole number"],
        {},
    ),
    (
        "rule-count-bad-bound",
        {"rules.d/a.yaml": rule("{gpu_count: {min: 2, mx: 4}}")},
        [],
        ["a.yaml:4:", "unknown bound 'mx' (did you mean 'max'?); valid: min, max"],
        {},
    ),
    (
        "rule-count-empty-range",
        {"rules.d/a.yaml": rule("{gpu_count: {}}")},
        [],
        ["a.yaml:4:", "an empty range"],
        {},
    ),
    (
        "rule-numa-negative",
        {"rules.d/a.yaml": rule("{numa_nodes: -1}")},
        [],
        ["a.yaml:4:", "numa_nodes: expected a whole number >= 0"],
        {},
    ),
    (
        "rule-memory-nan",
        {"rules.d/a.yaml": rule("{memory_gib: {min: .nan}}")},
        [],
        ["a.yaml:4:", "memory_gib: expected a finite number of GiB"],
        {},
    ),
    (
        "rule-memory-inf",
        {"rules.d/a.yaml": rule("{memory_gib: .inf}")},
        [],
        ["a.yaml:4:", "memory_gib: expected a finite number of GiB"],
        {},
    ),
    (
        "rule-unknown-profile",
        {"rules.d/a.yaml": rule("{gpu_count: 1}", "rtx4909-24g")},
        [],
        ["a.yaml:2: unknown profile 'rtx4909-24g' (did you mean 'rtx4090-24g'?); available:"],
        {},
    ),
    (
        "rule-profile-list",
        {"rules.d/a.yaml": "rules:\n  - profile: [base, cpu-only]\n"},
        [],
        ["a.yaml:2: 'profile' must be a profile name"],
        {},
    ),
    (
        "rule-no-profile",
        {"rules.d/a.yaml": "rules:\n  - when: {gpu_count: 1}\n"},
        [],
        ["a.yaml:2: each rule needs 'profile:'"],
        {},
    ),
    (
        "rule-when-list",
        {"rules.d/a.yaml": "rules:\n  - profile: base\n    when: [gpu_count]\n"},
        [],
        ["a.yaml:3: 'when' must be a mapping of predicates"],
        {},
    ),
    (
        "rule-unknown-key",
        {"rules.d/a.yaml": "rules:\n  - profile: base\n    whem: {gpu_count: 1}\n"},
        [],
        ["a.yaml:3: unknown rule key 'whem' (did you mean 'when'?); valid: profile, when, why"],
        {},
    ),
    (
        "rule-unknown-predicate",
        {"rules.d/a.yaml": rule("{gpu_nmae: A100}")},
        [],
        ["a.yaml:2: unknown rule predicate 'gpu_nmae' (did you mean 'gpu_name'?)"],
        {},
    ),
    (
        "rules-unknown-top",
        {"rules.d/a.yaml": "rulez: []\nrules: []\n"},
        [],
        ["a.yaml:1: unknown key 'rulez'"],
        {},
    ),
    (
        "rules-not-list",
        {"rules.d/a.yaml": "rules: {profile: base}\n"},
        [],
        ["a.yaml:1: expected 'rules:' with a list"],
        {},
    ),
]

HOSTS = {"rtx4090": "rtx4090-1x", "a800": "a800-pcie-4x-2numa"}


@pytest.fixture(scope="session")
def snapshots(tmp_path_factory: pytest.TempPathFactory, fake_nvml_dir: Path) -> dict[str, Path]:
    """Saved host snapshots (``--from``): the plan subprocesses then need no fake NVML."""
    from fakehost import build

    root = tmp_path_factory.mktemp("snapshots")
    out = {}
    for short, name in HOSTS.items():
        host = build(name, root / name)
        r = subprocess.run(
            [sys.executable, "-m", "hwprofile", "detect", "--json"],
            env=host.env(fake_nvml_dir),
            capture_output=True,
            text=True,
            check=True,
        )
        out[short] = root / f"{name}.json"
        out[short].write_text(r.stdout)
    return out


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    return {**env, **extra}


def _tree(*dirs: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for d in dirs:
        for dirpath, dirnames, filenames in os.walk(d):
            for n in dirnames + filenames:
                p = os.path.join(dirpath, n)
                st = os.lstat(p)
                out[p] = (st.st_size, st.st_mtime_ns)
    return out


def _materialize(root: Path, files: dict[str, Any]) -> None:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if content is FIFO:
            os.mkfifo(p)
        elif content is DEV_ZERO:
            p.symlink_to("/dev/zero")
        elif content is DIRECTORY:
            p.mkdir()
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


def plan_args(snapshots: dict[str, Path], args: list[str]) -> list[str]:
    host = "rtx4090"
    if "--host" in args:
        i = args.index("--host")
        host = args[i + 1]
        args = args[:i] + args[i + 2 :]
    return ["plan", "--from", str(snapshots[host]), *args]


def run_plan(
    snapshots: dict[str, Path], root: Path, args: list[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwprofile", *plan_args(snapshots, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


@pytest.mark.parametrize(("name", "files", "args", "expect", "extra_env"), CASES, ids=[c[0] for c in CASES])
def test_hostile_input_exits_2(
    tmp_path: Path,
    snapshots: dict[str, Path],
    name: str,
    files: dict[str, Any],
    args: list[str],
    expect: list[str],
    extra_env: dict[str, str],
) -> None:
    root, cache, cwd = tmp_path / "etc", tmp_path / "cache", tmp_path / "cwd"
    for d in (root, cache, cwd):
        d.mkdir()
    _materialize(root, files)
    args = [a.replace("{root}", str(root)) for a in args]
    expect = [e.replace("{root}", str(root)) for e in expect]
    env = _clean_env(HWPROFILE_CONFIG_ROOT=str(root), HWPROFILE_CACHE_DIR=str(cache), **extra_env)
    before = _tree(root, cwd)
    try:
        r = inproc.hwprofile(plan_args(snapshots, args), env, cwd=cwd)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: hwprofile plan hung (killed after 60 s)")
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""
    for e in expect:
        assert e in r.stderr, (e, r.stderr[-2000:])
    assert r.stderr.startswith("hwprofile: error: ")
    assert _tree(root, cwd) == before  # nothing written in the config root or the working folder
    hostile = {os.path.basename(rel) for rel in files}
    entries = [p.name for p in (cache / "yaml").glob("*.json")] if (cache / "yaml").is_dir() else []
    assert not [e for e in entries if e.split("-", 1)[1][: -len(".json")] in hostile]


@pytest.mark.parametrize(
    ("name", "files", "args", "expect", "extra_env"), CASES[::12], ids=[c[0] for c in CASES[::12]]
)
def test_the_in_process_cli_is_the_cli(
    tmp_path: Path,
    snapshots: dict[str, Path],
    name: str,
    files: dict[str, Any],
    args: list[str],
    expect: list[str],
    extra_env: dict[str, str],
) -> None:
    """The corpus runs in this process (tests/inproc.py); a sample of it run both ways says the same."""
    root, cwd = tmp_path / "etc", tmp_path / "cwd"
    for d in (root, cwd, tmp_path / "cache"):
        d.mkdir()
    _materialize(root, files)
    args = [a.replace("{root}", str(root)) for a in args]
    env = _clean_env(
        HWPROFILE_CONFIG_ROOT=str(root), HWPROFILE_CACHE_DIR=str(tmp_path / "cache"), **extra_env
    )
    a = run_plan(snapshots, root, args, env, cwd)
    b = inproc.hwprofile(plan_args(snapshots, args), env, cwd=cwd)
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


TEXT_WORDS = (
    "user",
    "name",
    "api-key",
    "extra-args",
    "dir-nul",
    "command",
    "model",
    "host",
    "extends",
    "description",
)


def test_corpus_size() -> None:
    families = {"yaml": 0, "numbers": 0, "merge": 0, "text": 0, "ports": 0, "rules": 0}
    for name, *_ in CASES:
        if name.startswith(("rule-", "rules-")):
            families["rules"] += 1
        elif "port" in name and ("instances" in name or "too-high" in name or "zero" in name):
            families["ports"] += 1
        elif name.startswith(("replace-", "drop-")):
            families["merge"] += 1
        elif name.startswith(("nan", "inf", "minus", "huge-size", "float-", "bool-", "zero")):
            families["numbers"] += 1
        elif any(w in name for w in TEXT_WORDS):
            families["text"] += 1
        else:
            families["yaml"] += 1
    assert len(CASES) >= 50 and len({c[0] for c in CASES}) == len(CASES)
    assert all(n >= 3 for n in families.values()), families


# -- a hang is a failure, not a stall -----------------------------------------------------------


@pytest.mark.parametrize("where", ["overrides.d", "rules.d", "profiles"])
def test_fifo_is_refused_without_opening(tmp_path: Path, snapshots: dict[str, Path], where: str) -> None:
    root = tmp_path / "etc"
    (root / where).mkdir(parents=True)
    fifo = root / where / "zz.yaml"
    os.mkfifo(fifo)
    env = _clean_env(HWPROFILE_CACHE_DIR="off")
    r = run_plan(snapshots, root, ["--config-root", str(root)], env, tmp_path)
    assert r.returncode == 2 and f"{fifo}: not a regular file (a FIFO)" in r.stderr, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dev_zero_and_a_growing_file_are_capped(tmp_path: Path) -> None:
    from hwprofile.config import yamlsrc

    with pytest.raises(ConfigError, match="not a regular file"):
        yamlsrc.load_file("/dev/zero")
    big = tmp_path / "big.yaml"
    big.write_text("# x\n" * (yamlsrc.MAX_BYTES // 4 + 1))
    with pytest.raises(ConfigError, match="limited to 1048576 bytes"):
        yamlsrc.load_file(big)


def test_alias_bomb_is_refused_fast() -> None:
    import time

    from hwprofile.config.yamlsrc import load_text

    assert len(ALIAS_BOMB.encode()) <= 400
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_text(ALIAS_BOMB, "bomb.yaml")
    assert time.monotonic() - t0 < 10  # refused at once (milliseconds); expanded, it would not end


# -- what the rules mean now ---------------------------------------------------------------------


def _profiles_json(snapshots: dict[str, Path], root: Path) -> dict[str, Any]:
    import json

    r = subprocess.run(
        [sys.executable, "-m", "hwprofile", "profiles", "--json", "--from", str(snapshots["rtx4090"])],
        env=_clean_env(HWPROFILE_CONFIG_ROOT=str(root), HWPROFILE_CACHE_DIR="off"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize(
    ("when", "matches"),
    [
        ("{compute_capability: {min: 9}}", False),  # an RTX 4090 is 8.9: used to match (9 read as 0.0)
        ("{compute_capability: {min: 8.9}}", True),
        ('{compute_capability: {min: "8.0", max: "8.9"}}', True),
        ("{compute_capability: 8.9}", True),
        ('{compute_capability: "9.0"}', False),  # a bare value is exact (it used to match anything)
        ("{nvlink: false}", True),
        ("{nvlink: true}", False),
        ("{gpu_count: {min: 1, max: 1}, memory_gib: {min: 20}}", True),
        ("{gpu_name: 'rtx 40[0-9]0'}", True),
    ],
)
def test_rule_predicates_mean_what_they_say(
    tmp_path: Path, snapshots: dict[str, Path], when: str, matches: bool
) -> None:
    (tmp_path / "rules.d").mkdir()
    (tmp_path / "rules.d" / "a.yaml").write_text(rule(when, "generic-large"))
    out = _profiles_json(snapshots, tmp_path)
    assert out["rules"][0]["matched"] is matches, out["rules"][0]
    assert (out["chosen"] == "generic-large") is matches


# -- fuzzing the YAML settings loader ------------------------------------------------------------


TOKENS = [
    "engine",
    "layout",
    "server",
    "memory",
    "speculative",
    "logs",
    "supervise",
    "cpu",
    "model",
    "max_num_seqs",
    "gpu_memory_utilization",
    "port",
    "user",
    "api_key_env",
    "extra_args",
    "margin_bytes",
    "by_batch_size",
    "_replace",
    "_drop",
    "method",
    "host",
    "profile",
    ":",
    ": ",
    "\n",
    "\n  ",
    "\n    ",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "&a ",
    "*a",
    "<<: ",
    "? ",
    "!!str ",
    "!!int ",
    "!!float ",
    "!!binary ",
    "!!python/none ",
    "!!set ",
    "---\n",
    "...\n",
    "#",
    "'",
    '"',
    "\\n",
    "\\x00",
    "\t",
    "\x00",
    "\x1b",
    "\u2028",
    "null",
    "~",
    "true",
    "no",
    "yes",
    ".nan",
    ".inf",
    "-.inf",
    "0",
    "-1",
    "1e400",
    "0x1f",
    "0o17",
    "1_000",
    "65536",
    "9" * 30,
    "2024-13-45",
    "12:30:00",
    "1GiB",
    "64M",
    "auto",
    "ngram",
    "[[1, null, 3]]",
    "%YAML 1.1\n",
]


def _validate(text: str) -> None:
    from hwprofile.config.schema import PROFILE_ONLY, validate
    from hwprofile.config.yamlsrc import load_text, source_of

    data, locs = load_text(text, "fuzz.yaml")
    validate(data, lambda p: source_of("overrides", "fuzz.yaml", locs, p), allowed_top=PROFILE_ONLY)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(TOKENS), max_size=40).map("".join))
def test_fuzz_token_soup_only_config_errors(text: str) -> None:
    with contextlib.suppress(ConfigError):
        _validate(text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_fuzz_any_text_only_config_errors(text: str) -> None:
    with contextlib.suppress(ConfigError):
        _validate(text)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
trees = st.recursive(
    scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=12), kids, max_size=4)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(["engine", "layout", "server", "memory", "speculative", "logs", "supervise", "cpu"])
LEAVES = st.sampled_from(
    [
        "max_num_seqs",
        "gpu_memory_utilization",
        "port",
        "user",
        "api_key_env",
        "extra_args",
        "margin_bytes",
        "by_batch_size",
        "_replace",
        "_drop",
        "method",
        "host",
        "dir",
        "ready_timeout",
        "kv_cache_space_gib",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, st.dictionaries(LEAVES, trees, max_size=5), max_size=4))
def test_fuzz_structured_settings_only_config_errors(doc: dict[str, Any]) -> None:
    import yaml

    text = yaml.safe_dump(doc, allow_unicode=True)
    with contextlib.suppress(ConfigError):
        _validate(text)
