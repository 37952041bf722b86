"""Format a :class:`Rendered` instance through the jinja2 templates (formatting only).

Every value reaches a file through the quoting of the format it lands in: systemd's own rules for
``ExecStart=`` words and directive values (specifiers ``%``, variables ``$``, C escapes), YAML
through ``yaml.safe_dump``, environment files in single quotes that systemd's ``EnvironmentFile=``
and a POSIX shell read back alike, comments and descriptions with control characters shown as
escapes. What a format cannot represent is refused (:class:`UnsafeValue`), never written. As a last
guard, a template expression whose text still holds a line break or other control character, and
did not come out of one of those quoting filters, stops the render.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import unicodedata
from pathlib import Path
from typing import Any

import jinja2

from ..errors import InputError
from ..host.snapshot import MAX_DEVICE_MINOR
from ..plan.types import ABSENT, InstancePlan, Plan
from .translate import Rendered, flatten

FORMATS = ("argv", "shell", "yaml", "env", "systemd", "json")  # one file per instance
SUFFIXES = {
    "argv": ".argv.json",
    "shell": ".sh",
    "yaml": ".yaml",
    "env": ".env",
    "systemd": ".service",
    "json": ".json",
    "nginx": ".nginx.conf",
    "k8s": ".k8s.yaml",
}
# every `render --format` (the CLI's choices): the per-instance FORMATS, then the host's front and k8s
ALL_FORMATS = tuple(SUFFIXES)

# A word systemd and a shell both take as it is (no quotes, specifiers, variables or escapes).
_SYSTEMD_BARE = re.compile(r"[A-Za-z0-9_./:=,+@-]+")
_ENV_BARE = re.compile(r"[A-Za-z0-9_./:=,+@%-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Instance names become file names, unit names and state directories: one plain component.
_INSTANCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,99}")
# systemd's User= (a user name or a numeric UID), as its own checks accept them.
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,30}|[0-9]{1,10}")
_CPUS = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")
# Categories that break or hide lines: controls (C0, DEL, C1 incl. NEL), format characters
# (bidi overrides, zero width), line and paragraph separators (YAML line breaks), lone surrogates.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_C_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\v": "\\v"}


class UnsafeValue(InputError, ValueError):
    """A value cannot be represented in the requested format; the message says which and why."""


class _Quoted(str):
    """Text a quoting filter produced for its format: the final guard lets it through as it is."""


def template_dir() -> Path:
    package = Path(__file__).resolve().parents[1]
    shipped = package / "templates"
    return shipped if shipped.is_dir() else package.parent / "templates"


def _show(value: str) -> str:
    """``value`` for an error message: one line, control characters escaped."""
    return "'" + label(value).replace("'", "\\'") + "'"


def _escape(ch: str) -> str:
    if ch in _C_ESCAPES:
        return _C_ESCAPES[ch]
    o = ord(ch)
    if o < 0x100:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES


def _utf8(value: str, what: str) -> str:
    """``value`` if it is text a file can hold (valid UTF-8, no NUL), else :class:`UnsafeValue`."""
    if "\0" in value:
        raise UnsafeValue(f"{what} {_show(value)} contains a NUL character")
    if any(unicodedata.category(c) == "Cs" for c in value):
        raise UnsafeValue(f"{what} {_show(value)} is not valid UTF-8 (a file name's raw bytes?)")
    return value


def label(value: object) -> str:
    """Free text for a comment or a description: one line, whatever it holds. Backslashes are
    doubled and control, format and line-separator characters are shown as C/Unicode escapes, so
    the text can neither end a line nor end in a backslash (a continuation in systemd files)."""
    text = str(value)
    return "".join("\\\\" if c == "\\" else _escape(c) if _unsafe(c) else c for c in text)


def systemd_text(value: object) -> str:
    """Free text for a systemd directive that expands specifiers (``Description=``)."""
    return label(value).replace("%", "%%")


def systemd_quote(arg: object, what: str = "an ExecStart= argument") -> str:
    """One word of an ``ExecStart=`` line, read back by systemd as exactly ``arg`` (see
    systemd.service(5), "Command lines"): specifiers doubled (``%%``), variables doubled (``$$``),
    anything else than plain characters in double quotes with C escapes for ``\\``, ``"`` and
    control characters. A NUL or invalid UTF-8 cannot be said: refused."""
    arg = _utf8(str(arg), what)
    if _SYSTEMD_BARE.fullmatch(arg):
        return arg
    out = []
    for c in arg:
        if c in '\\"':
            out.append("\\" + c)
        elif c == "%":
            out.append("%%")
        elif c == "$":
            out.append("$$")
        elif _unsafe(c):  # systemd unescapes \n \t \uNNNN \UNNNNNNNN; \xNN is one byte: ASCII only
            out.append(f"\\u{ord(c):04x}" if 0x80 <= ord(c) < 0x100 else _escape(c))
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def systemd_join(argv: list[str]) -> _Quoted:
    return _Quoted(" ".join(systemd_quote(a) for a in argv))


def systemd_path(path: str, what: str) -> str:
    """An absolute path for a directive that takes it raw (``EnvironmentFile=``): systemd does
    not unquote it, so what quoting would be needed for is refused; specifiers doubled."""
    _utf8(path, what)
    if not path.startswith("/"):
        raise UnsafeValue(f"{what} {_show(path)} is not an absolute path (systemd needs one)")
    if any(_unsafe(c) for c in path):
        raise UnsafeValue(f"{what} {_show(path)} contains a control or line-break character")
    if path != path.strip() or path.endswith("\\"):
        raise UnsafeValue(
            f"{what} {_show(path)} ends in white space or a backslash, which systemd would not keep"
        )
    return path.replace("%", "%%")


def env_name(name: object, what: str = "environment variable name") -> str:
    name = str(name)
    if not _ENV_NAME.fullmatch(name):
        raise UnsafeValue(f"{what} {_show(name)} is not a valid name (letters, digits, _; not a digit first)")
    return name


def env_quote(value: object, what: str = "an environment value") -> _Quoted:
    """A value for an environment file that systemd (``EnvironmentFile=``) and a POSIX shell
    (``set -a; . FILE``) both read back as exactly ``value``: plain characters as they are, else
    single quotes (nothing inside is special to either), a ``'`` as ``'"'"'``. Newlines and tabs
    survive single quotes in both; for other ASCII control characters systemd drops the variable,
    and it refuses invalid UTF-8: both refused here."""
    value = _utf8(str(value), what)
    bad = [c for c in value if (c < " " or c == "\x7f") and c not in "\t\n"]
    if bad:
        raise UnsafeValue(
            f"{what} contains the control character {_escape(bad[0])}: systemd would ignore the variable"
        )
    if _ENV_BARE.fullmatch(value):
        return _Quoted(value)
    return _Quoted("'" + value.replace("'", "'\"'\"'") + "'")


def to_yaml(data: object) -> _Quoted:
    import yaml

    return _Quoted(yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=1000).rstrip("\n"))


def shell_join(argv: list[str]) -> _Quoted:
    for a in argv:
        _utf8(str(a), "a command-line argument")
    return _Quoted(shlex.join(argv))


def _finalize(value: object) -> object:
    """The last guard: no template expression puts a line break or control character into a file
    unless a quoting filter made it safe for its format."""
    if isinstance(value, _Quoted) or not isinstance(value, str):
        return value
    if any(_unsafe(c) for c in value):
        raise UnsafeValue(f"{_show(value)} contains a control or line-break character")
    return value


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,  # a missing value is an error, never an empty string
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
    )
    env.filters.update(
        shell_join=shell_join,
        systemd_join=systemd_join,
        systemd_text=systemd_text,
        env_quote=env_quote,
        env_name=env_name,
        label=label,
        to_yaml=to_yaml,
    )
    return env


def check_name(name: str) -> str:
    """An instance name, which becomes a file name, a unit's state directory and a label: one
    plain path component (no ``/``, no ``..``, no leading dot), else :class:`UnsafeValue`."""
    if not _INSTANCE.fullmatch(name) or ".." in name:
        raise UnsafeValue(
            f"instance name {_show(name)} is not a safe file name "
            "(letters, digits, '_', '.', '@', ':', '-'; no '/' or '..')"
        )
    return name


def output_path(directory: str | os.PathLike[str], name: str, fmt: str) -> str:
    """The file ``--output DIR`` writes for instance ``name`` in format ``fmt``: always directly
    inside ``directory``."""
    d = os.path.abspath(directory)
    path = os.path.join(d, check_name(name) + SUFFIXES[fmt])
    if os.path.dirname(path) != d:  # belt and braces: check_name already allows no separator
        raise UnsafeValue(f"instance name {_show(name)} would write outside {d}")
    return path


def env_file_for(template: str, name: str) -> str:
    """``--env-file``: user text in which ``{name}`` (literally) stands for the instance; nothing
    else in it is interpreted."""
    return template.replace("{name}", name)


# What a CUDA process opens besides its GPUs: the control device and the unified-memory devices.
# Not /dev/nvidia-modeset (display only; vLLM never opens it).
NVIDIA_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
# When a GPU's minor is unknown: the driver's whole device group, in systemd's "char-<group>" form
# (systemd.resource-control(5), DeviceAllow=: "char-" followed by a device group name as listed in
# /proc/devices). The nvidia module registers major 195 (every /dev/nvidia<minor>, and nvidiactl)
# as "nvidia-frontend" where the driver has that frontend (nv-frontend.c, also in the open kernel
# modules), as "nvidia" where it does not; systemd resolves the names when the unit starts and
# leaves out one that /proc/devices does not list, so both are given. This opens every GPU of the
# host to the instance, which is wider than its own GPUs but never a wrong one.
NVIDIA_DEVICE_GROUPS = ("char-nvidia-frontend", "char-nvidia")


def device_allow(minors: object, gpus: int) -> list[str]:
    """The ``DeviceAllow=`` entries of a CUDA instance with ``gpus`` GPUs whose device minors (the
    plan's ``gpu_minors``) are ``minors``: its GPUs as ``/dev/nvidia<minor>``, named after the minor,
    which need not be the NVML index. When any minor is unknown (a snapshot taken before minors
    were recorded, a driver that did not say), the index is never used in its place: the unit
    allows :data:`NVIDIA_DEVICE_GROUPS` instead, all of the driver's GPUs."""
    if (
        isinstance(minors, list)
        and len(minors) == gpus
        and all(type(m) is int and 0 <= m <= MAX_DEVICE_MINOR for m in minors)
    ):
        gpu_devices = [f"/dev/nvidia{m}" for m in minors]
    else:
        gpu_devices = list(NVIDIA_DEVICE_GROUPS)
    return [*NVIDIA_CONTROL_DEVICES, *gpu_devices]


def _context(
    r: Rendered, plan: Plan, inst: InstancePlan, env_file: str, secret_values: dict[str, str]
) -> dict[str, Any]:
    gpus = r.gpus
    known = inst.gpu_minors
    minors = None if known is ABSENT else list(known) if isinstance(known, tuple) else known
    devices = device_allow(minors, len(gpus)) if r.device == "cuda" else []
    user = inst.server.user
    if user is not None and not _USER.fullmatch(str(user)):
        raise UnsafeValue(f"server.user {_show(str(user))} is not a user name systemd accepts")
    if r.cpus and not _CPUS.fullmatch(r.cpus):
        raise UnsafeValue(f"CPU list {_show(r.cpus)} is not a list of CPU numbers and ranges")
    for source in r.secrets.values():
        env_name(source, "server.api_key_env")
    return {
        "name": r.name,
        "vllm_version": r.vllm_version,
        "flag_table": r.flag_table,
        "model": plan.model.path or plan.model.name,
        "profile": plan.profile,
        "argv": r.argv,
        "config": r.config(),
        "env": r.env,
        "secret_values": secret_values,
        "secret_refs": r.secrets,
        "env_file": env_file,
        "state_name": f"hwprofile/{r.name}",
        "stop_timeout_s": int(r.stop_timeout_s),
        "user": user,
        "numa_node": None if r.numa_node is None else int(r.numa_node),
        "cpus": r.cpus,
        "devices": devices,
        "device_label": (f"GPU {','.join(str(int(g)) for g in gpus)}" if gpus else "CPU"),
    }


def render(
    r: Rendered,
    fmt: str,
    plan: Plan,
    inst: InstancePlan,
    env_file: str = "/etc/hwprofile/env/{name}.env",
    secret_values: dict[str, str] | None = None,
) -> str:
    """``secret_values`` (VLLM_API_KEY → the key) is only used by the ``env`` format, which callers
    write to a 0600 file; every other format names the variable, never its value. A value the
    format cannot carry raises :class:`UnsafeValue`."""
    check_name(r.name)
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
    path = env_file_for(env_file, r.name)
    if fmt == "systemd":
        path = systemd_path(path, "--env-file")
    tpl = environment().get_template(names[fmt])
    text = tpl.render(**_context(r, plan, inst, path, secret_values or {}))
    if fmt == "yaml":
        _same_yaml(text, r.config())
    return text


_NGINX_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")


def render_nginx(plan: Plan) -> str:
    """nginx's ``conf.d/`` file for the plan's endpoint: one upstream of every instance, one server on
    ``layout.endpoint_port``. Only for a plan whose endpoint is nginx (several separate servers)."""
    ep = plan.endpoint
    if ep is None or ep.via != "nginx":
        how = ep.how if ep is not None else "no endpoint"
        raise UnsafeValue(f"this plan needs no nginx: its one URL is {ep.url if ep else '?'} ({how})")
    by_name = {i.name: i for i in plan.instances}

    def address(host: str, port: int, what: str) -> str:
        h = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        if not _NGINX_HOST.fullmatch(h):
            raise UnsafeValue(f"{what} {_show(h)} cannot be written into an nginx configuration")
        return f"{h}:{int(port)}"

    servers = [
        {"name": label(n), "address": address(by_name[n].server.host, by_name[n].server.port, "server.host")}
        for n in ep.instances
    ]
    import urllib.parse

    parts = urllib.parse.urlsplit(ep.url)
    listen = address(parts.hostname or "127.0.0.1", parts.port or 80, "the endpoint's host")
    longest = max((int(by_name[n].server.shutdown_timeout) for n in ep.instances), default=0)
    return (
        environment()
        .get_template("nginx.conf.j2")
        .render(
            url=label(ep.url),
            servers=servers,
            listen=listen,
            read_timeout_s=max(3600, longest),
        )
    )


def _same_yaml(text: str, config: dict[str, Any]) -> None:
    """The YAML file must read back as exactly the mapping it was made from."""
    import yaml

    # libyaml's safe loader where PyYAML has it (as config.yamlsrc reads every file)
    if yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) != config:
        raise UnsafeValue("the --config YAML does not read back as the planned settings")
