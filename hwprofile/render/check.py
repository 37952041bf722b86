"""Check rendered arguments with the installed vLLM's own parser and engine-config construction,
offline, without starting an engine. Importing vLLM costs seconds, so this runs in a subprocess and
its answer is cached per vLLM version (and arguments)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

# Runs inside the vLLM environment. Module paths move between releases: probe, don't assume.
CHECK_SCRIPT = r"""
import contextlib, io, json, sys
args = json.loads(sys.argv[1])
out = {"ok": False, "stage": "import", "message": ""}
def done():
    print("HWPROFILE-CHECK " + json.dumps(out)); sys.exit(0)
try:
    import vllm
    out["vllm_version"] = getattr(vllm, "__version__", None)
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    make = None
    for name in ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args"):
        try:
            make = __import__(name, fromlist=["make_arg_parser"]).make_arg_parser
            break
        except (ImportError, AttributeError):
            pass
    from vllm.engine.arg_utils import AsyncEngineArgs
except Exception as e:
    out["message"] = f"{type(e).__name__}: {e}"; done()
out["stage"] = "parse"
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        ns = make(FlexibleArgumentParser(prog="vllm serve")).parse_args(args)
except SystemExit as e:
    lines = [l for l in err.getvalue().strip().splitlines() if l.strip()]
    out["message"] = lines[-1] if lines else f"argument parser exited with {e.code}"
    done()
if getattr(ns, "model_tag", None):
    ns.model = ns.model_tag
out["stage"] = "engine-config"
try:
    with contextlib.redirect_stdout(io.StringIO()):
        AsyncEngineArgs.from_cli_args(ns).create_engine_config()
except Exception as e:
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip() and "errors.pydantic.dev" not in l]
    lines = [l for l in lines if not l.endswith("validation error for VllmConfig") and "validation error for" not in l] or lines
    import re
    out["message"] = re.sub(r"\s*\[type=[^\]]*\]\s*$", "", f"{type(e).__name__}: " + " ".join(lines[-3:]))
    done()
out["ok"] = True
out["stage"] = "done"
done()
"""


class CheckResult(NamedTuple):
    ok: bool
    stage: str  # import, parse, engine-config, done
    message: str
    vllm_version: str | None
    cached: bool


def cache_dir() -> Path:
    from ..runtime.dirs import cache_dir as hwprofile_cache

    return hwprofile_cache() / "check"


def check_args(
    vllm_args: list[str],
    model: str,
    vllm_version: str,
    env: dict[str, str],
    python: str | None = None,
    use_cache: bool = True,
) -> CheckResult:
    """``vllm_args`` are vLLM's own flags (no NUMA wrapper, no ``vllm serve``); the model goes in as
    ``--model`` (every release has it)."""
    args = ["--model", model, *vllm_args]
    key = hashlib.sha256(json.dumps([args, _model_stamp(model)]).encode()).hexdigest()[:24]
    path = cache_dir() / vllm_version / f"{key}.json"
    if use_cache and path.is_file():
        try:
            d = json.loads(path.read_text())
            return CheckResult(d["ok"], d["stage"], d["message"], d.get("vllm_version"), True)
        except (OSError, ValueError, KeyError):
            pass
    proc = subprocess.run(
        [python or sys.executable, "-c", CHECK_SCRIPT, json.dumps(args)],
        env={**os.environ, **env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("HWPROFILE-CHECK ")), None)
    if line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return CheckResult(False, "run", f"the check did not complete: {tail[0]}", None, False)
    d = json.loads(line.split(" ", 1)[1])
    result = CheckResult(bool(d["ok"]), d["stage"], d["message"], d.get("vllm_version"), False)
    if d["stage"] != "import":  # an import failure is about the environment, not the arguments
        _store(path, json.dumps(d))
    return result


def _store(path: Path, text: str) -> None:
    """Keep a check result: atomically, never through a link; a cache that cannot be written is
    only a slower next check."""
    from ..runtime.files import atomic_write

    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, text, 0o600)
    except OSError:  # WriteError included
        pass


def _model_stamp(model: str) -> str | None:
    cfg = Path(model) / "config.json"
    try:
        st = cfg.stat()
        return f"{st.st_mtime_ns}:{st.st_size}"
    except OSError:
        return None
