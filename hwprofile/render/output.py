"""Format a :class:`Rendered` instance through the jinja2 templates (formatting only)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import jinja2

from .translate import Rendered, flatten

FORMATS = ("argv", "shell", "yaml", "env", "systemd", "json")
_SAFE = re.compile(r"^[A-Za-z0-9_./:=,+@%-]+$")


def template_dir() -> Path:
    package = Path(__file__).resolve().parents[1]
    shipped = package / "templates"
    return shipped if shipped.is_dir() else package.parent / "templates"


def systemd_quote(arg: str) -> str:
    """One word of an ExecStart= line: specifiers (%) and variables ($) are escaped."""
    arg = str(arg).replace("%", "%%")
    if _SAFE.match(arg) and "$" not in arg:
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$") + '"'


def env_quote(value: str) -> str:
    """A value for an environment file read by systemd (EnvironmentFile=) and by a POSIX shell."""
    value = str(value)
    if _SAFE.match(value) and "%" not in value:
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    return f'"{escaped}"'


def to_yaml(data: Any) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=1000).rstrip("\n")


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,  # a missing value is an error, never an empty string
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        shell_join=shlex.join,
        systemd_join=lambda argv: " ".join(systemd_quote(a) for a in argv),
        env_quote=env_quote,
        to_yaml=to_yaml,
    )
    return env


def _context(
    r: Rendered, plan: dict[str, Any], inst: dict[str, Any], env_file: str, secret_values: dict[str, str]
) -> dict[str, Any]:
    gpus = r.gpus
    devices = (
        (["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] + [f"/dev/nvidia{g}" for g in gpus])
        if r.device == "cuda"
        else []
    )
    return {
        "name": r.name,
        "vllm_version": r.vllm_version,
        "flag_table": r.flag_table,
        "model": plan["model"]["path"] or plan["model"]["name"],
        "profile": plan["profile"],
        "argv": r.argv,
        "config": r.config(),
        "env": r.env,
        "secret_values": secret_values,
        "secret_refs": r.secrets,
        "env_file": env_file,
        "state_name": f"hwprofile/{r.name}",
        "stop_timeout_s": r.stop_timeout_s,
        "user": inst["server"].get("user"),
        "numa_node": r.numa_node,
        "cpus": r.cpus,
        "devices": devices,
        "device_label": (f"GPU {','.join(map(str, gpus))}" if gpus else "CPU"),
    }


def render(
    r: Rendered,
    fmt: str,
    plan: dict[str, Any],
    inst: dict[str, Any],
    env_file: str = "/etc/hwprofile/env/{name}.env",
    secret_values: dict[str, str] | None = None,
) -> str:
    """``secret_values`` (VLLM_API_KEY → the key) is only used by the ``env`` format, which callers
    write to a 0600 file; every other format names the variable, never its value."""
    env_file = env_file.format(name=r.name)
    if fmt == "argv":
        return json.dumps(r.argv) + "\n"
    if fmt == "json":
        out = {
            "name": r.name,
            "vllm_version": r.vllm_version,
            "flag_table": r.flag_table,
            "argv": r.argv,
            "prefix": r.prefix,
            "command": r.command,
            "args": flatten(r.args),
            "config": r.config(),
            "env": r.env,
            "secrets_from": r.secrets,
            "numa_node": r.numa_node,
            "gpus": r.gpus,
            "stop_timeout_s": r.stop_timeout_s,
            "shell": shlex.join(r.argv),
            "warnings": r.warnings,
        }
        return json.dumps(out, indent=2) + "\n"
    names = {
        "shell": "shell.j2",
        "yaml": "vllm-config.yaml.j2",
        "env": "instance.env.j2",
        "systemd": "vllm-instance.service.j2",
    }
    tpl = environment().get_template(names[fmt])
    return tpl.render(**_context(r, plan, inst, env_file, secret_values or {}))
