"""A Hugging Face Hub model planned before its download: its ``config.json`` (and the small files
beside it), the repository's file list with sizes, the safetensors index and, where the sizes alone
are ambiguous, the dtypes of the safetensors headers (range requests) -- never the weights.

Everything goes through ``huggingface_hub`` (imported here, lazily, only when the Hub is asked; it
comes with vLLM): ``HfApi.model_info(files_metadata=True)`` for the commit and the sizes,
``hf_hub_download`` for the small files (so they land in the Hugging Face cache layout, where vLLM and
a later plan find them), ``HfApi.parse_safetensors_file_metadata`` for a header. What the planner
needs beyond the files (the file list, the weight files chosen and their bytes, the dtypes) is kept
beside them, in ``<cache>/models--ORG--NAME/hwprofile/<commit>.json`` (:func:`record_path`), so a
second plan needs no network: ``HF_HUB_OFFLINE=1`` plans from there.

Honours ``HF_ENDPOINT``, ``HF_HOME``/``HF_HUB_CACHE``, ``HF_TOKEN`` (sent by ``huggingface_hub``; never
printed: every message is scrubbed of it), ``HF_HUB_OFFLINE`` and ``HF_HUB_ETAG_TIMEOUT`` (each request;
the whole look-up is bounded at :data:`DEADLINE_FACTOR` times it). Reads the network and writes the
cache; every failure is a :mod:`hwprofile.errors` error saying the fix.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from typing import TYPE_CHECKING, Any

from ..config import ConfigError
from ..errors import HwprofileError, OperationError, RefusedError
from .repoid import COMMIT, is_repo_id, split_revision

if TYPE_CHECKING:
    from collections.abc import Iterator

    from huggingface_hub import HfApi, ModelInfo

    from .facts import ModelFacts

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_TIMEOUT_S = 10.0  # huggingface_hub's own default for HF_HUB_ETAG_TIMEOUT
DEADLINE_FACTOR = 4  # the whole look-up: at most this many request timeouts
RECORD_SCHEMA = "hwprofile.hub-files/1"
RECORD_DIR = "hwprofile"  # inside the cache's models--ORG--NAME folder (scan-cache ignores it)
INDEX = "model.safetensors.index.json"
# the small files fetched beside config.json where the repository has them: the planner's
# quantization config (older GPTQ/AWQ/ModelOpt checkpoints keep it apart), and what vLLM and the
# draft check read next (generation defaults, the tokenizer's roles)
SMALL_FILES = (
    "quantize_config.json",
    "quant_config.json",
    "hf_quant_config.json",
    "generation_config.json",
    "tokenizer_config.json",
)
PICKLE = re.compile(r"\.(bin|pt|pth|ckpt|pkl)\Z")
MAX_HEADERS = 8  # safetensors headers read when the dtypes are needed (a sample of the shards)
MAX_RECORD_BYTES = 16 << 20
# the Hub's own rules: ORG/NAME of letters, digits, '-', '_', '.'; no '--' or '..'
# (full-match patterns: ``$`` would also match before a trailing newline)
MAX_TIMEOUT_S = 3600  # HF_HUB_ETAG_TIMEOUT above an hour is a mistake, not a slow link
API_CAP = 32 << 20  # an API answer (the file list of a large repository is a few MiB)
SMALL_CAP = 64 << 20  # a config or an index file downloaded; the file list's size bounds it further
HEADER_CAP = 26 << 20  # a safetensors header answer (huggingface_hub's own limit is 25 MB)
# safetensors dtypes → config.json's torch_dtype (the float ones a checkpoint is served in)
_TORCH_DTYPE = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F8_E4M3": "float8_e4m3fn"}
_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


# -- names ---------------------------------------------------------------------------------------


def with_revision(spec: str | None, revision: str | None) -> str | None:
    """The model spec with ``--revision`` applied (``NAME@REV``); a spec naming another revision
    already, or a directory, is an error."""
    if not revision:
        return spec
    if spec is None:
        raise ConfigError("--revision needs --model NAME (a Hugging Face name), or write NAME@REVISION")
    name, rev = split_revision(spec)
    if rev is not None and rev != revision:
        raise ConfigError(f"--model {spec} and --revision {revision} name two revisions: give one")
    if os.path.isdir(os.path.expanduser(name)) or not is_repo_id(name):
        raise ConfigError(f"--revision {revision}: applies to a Hugging Face name (ORG/NAME), not {name!r}")
    split_revision(f"{name}@{revision}")  # checks the revision's spelling
    return f"{name}@{revision}"


# -- the environment -----------------------------------------------------------------------------


def _true(value: str | None) -> bool:
    return (value or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set: the Hub is not asked."""
    return _true(os.environ.get("HF_HUB_OFFLINE")) or _true(os.environ.get("TRANSFORMERS_OFFLINE"))


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def timeout_s() -> float:
    """Each request's timeout: ``HF_HUB_ETAG_TIMEOUT`` (whole seconds, 1 to an hour), else 10.

    Parsed as ``huggingface_hub`` parses it (``int()``, at its import): ``2.5`` or ``inf`` would make
    every look-up fail there without naming the variable, so it is an error here that names it."""
    raw = os.environ.get("HF_HUB_ETAG_TIMEOUT")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        t = int(raw)
    except ValueError:
        t = None
    if t is None or not 1 <= t <= MAX_TIMEOUT_S:
        raise ConfigError(
            f"HF_HUB_ETAG_TIMEOUT={raw[:40]!r}: expected a whole number of seconds from 1 to {MAX_TIMEOUT_S} "
            "(huggingface_hub reads it with int()); unset it for the default of 10"
        )
    return float(t)


def _scrub(text: str) -> str:
    """``text`` without the token (no message of hwprofile's ever shows it)."""
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token and len(token) >= 4:
        text = text.replace(token, "***")
    text = re.sub(r"(?i)(bearer\s+)\S+", r"\1***", text)
    return re.sub(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]*@", r"\1***@", text)  # a password in a URL


def shown(ep: str) -> str:
    """The endpoint as messages and records show it: without a user or password."""
    return _scrub(ep)


# -- the cache -----------------------------------------------------------------------------------


def repo_folder(cache: str, repo: str) -> str:
    return os.path.join(cache, "models--" + repo.replace("/", "--"))


def record_path(cache: str, repo: str, commit: str) -> str:
    """Where hwprofile keeps the Hub's file list of one commit, beside the cached files."""
    return os.path.join(repo_folder(cache, repo), RECORD_DIR, commit + ".json")


def commit_of(cache: str, repo: str, revision: str | None) -> str | None:
    """The commit the cache knows ``revision`` (default main) as: itself when a commit, else its ref."""
    rev = revision or "main"
    if COMMIT.fullmatch(rev):
        return rev
    from ..runtime.files import read_bounded

    try:
        sha = read_bounded(os.path.join(repo_folder(cache, repo), "refs", rev), 4096).decode("utf-8").strip()
    except (OSError, ValueError):
        return None
    return sha if COMMIT.fullmatch(sha) else None


def load_record(cache: str, repo: str, commit: str) -> dict[str, Any] | None:
    """The saved file list of ``commit``, if there is one of this schema (else None: fetch again)."""
    from ..runtime.files import read_bounded

    try:
        doc = json.loads(read_bounded(record_path(cache, repo, commit), MAX_RECORD_BYTES).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return doc if _record_ok(doc, commit) else None


def _count(v: object) -> bool:
    return type(v) is int and v >= 0


def _record_ok(doc: object, commit: str) -> bool:
    """A record of this schema and commit whose every value has its type (one that does not is
    fetched again, not trusted: the cache is a place others may write)."""
    if not (isinstance(doc, dict) and doc.get("schema") == RECORD_SCHEMA and doc.get("commit") == commit):
        return False
    files, w, dtypes = doc.get("files"), doc.get("weights"), doc.get("dtypes")
    return (
        isinstance(files, dict)
        and all(isinstance(k, str) and (v is None or _count(v)) for k, v in files.items())
        and isinstance(w, dict)
        and isinstance(w.get("files"), list)
        and all(
            type(f) is str and f and not f.startswith("/") and ".." not in f.split("/") for f in w["files"]
        )
        and _count(w.get("bytes", 0))
        and isinstance(w.get("source", ""), str)
        and (
            dtypes is None
            or (isinstance(dtypes, dict) and all(isinstance(k, str) and _count(v) for k, v in dtypes.items()))
        )
        and isinstance(doc.get("endpoint", ""), str)
    )


def weights_missing(snapshot: str, record: dict[str, Any]) -> bool:
    """Whether the snapshot lacks any weight file the record names (only the config was fetched)."""
    return any(not os.path.isfile(os.path.join(snapshot, f)) for f in record["weights"]["files"])


def _write_ref(cache: str, repo: str, revision: str, commit: str, label: str) -> None:
    """refs/REV → commit, as huggingface_hub writes it (hf_hub_download at a commit writes none)."""
    if COMMIT.fullmatch(revision):
        return
    *dirs, name = revision.split("/")
    _cache_write(cache, (os.path.basename(repo_folder(cache, repo)), "refs", *dirs), name, commit, label)


def _cache_write(cache: str, parts: tuple[str, ...], name: str, data: str, label: str) -> None:
    """A file hwprofile keeps in the cache, written by :func:`trusted_write` (no link followed, no
    folder of another user's or writable by others on the way)."""
    import errno

    from ..runtime.files import UnsafeDirectory, WriteError, trusted_write

    try:
        trusted_write(cache, parts, name, data, 0o644, durable=False)
    except UnsafeDirectory as e:
        raise _unsafe_cache(cache, label, e) from None
    except WriteError as e:
        if e.errno == errno.EEXIST:  # the file itself a link, a folder, not a regular file
            raise _unsafe_cache(cache, label, e) from None
        raise


def _unsafe_cache(cache: str, label: str, e: OSError) -> ConfigError:
    return ConfigError(
        f"{label}: will not write into the Hugging Face cache {cache}: {e.strerror}; another user could "
        "redirect what is written there (a link to a file of this user's). Set HF_HUB_CACHE (or HF_HOME) "
        "to a folder of this user's own, or make the folder this user's (chown) and not writable by others "
        "(chmod go-w)"
    )


def check_cache(cache: str, repo: str, commit: str | None, revision: str | None, label: str) -> None:
    """Before anything is written into ``cache`` for ``repo`` (by huggingface_hub or hwprofile): every
    folder on the way that exists is this user's alone, none a link (:func:`check_trusted_dirs`).
    huggingface_hub follows links as it writes; so a folder that another user can change is refused
    here, before the first request that writes (an error, exit 2: planning without the cache would
    leave vLLM to download into the same folder)."""
    from ..runtime.files import UnsafeDirectory, WriteError, check_trusted_dirs

    folder = os.path.basename(repo_folder(cache, repo))
    trees: list[tuple[str, ...]] = [
        (".locks", folder),
        (folder, "blobs"),
        (folder, RECORD_DIR),
        (folder, ".no_exist"),
    ]
    if commit:
        trees += [(folder, "snapshots", commit), (folder, ".no_exist", commit)]
    else:
        trees.append((folder, "snapshots"))
    rev = revision or "main"
    if not COMMIT.fullmatch(rev):
        trees.append((folder, "refs", *rev.split("/")[:-1]))
    try:
        check_trusted_dirs(cache, *trees)
    except UnsafeDirectory as e:
        raise _unsafe_cache(cache, label, e) from None
    except WriteError:
        pass  # not a folder of another user's: huggingface_hub says what else is wrong


# -- facts ---------------------------------------------------------------------------------------


def facts_from_record(
    repo: str, cache: str, commit: str, record: dict[str, Any], how: str, revision: str | None = None
) -> ModelFacts:
    """ModelFacts from the cached config.json (and quantization config) and the saved file list."""
    from .files import MAX_CONFIG_BYTES, _read_json, with_checkpoint_bytes
    from .hfconfig import parse_config

    snap = os.path.join(repo_folder(cache, repo), "snapshots", commit)
    cfg_path = os.path.join(snap, "config.json")
    try:
        cfg = _read_json(cfg_path, MAX_CONFIG_BYTES, "model config")
    except FileNotFoundError:
        raise ConfigError(f"{cfg_path}: missing from the cache (removed?): plan again online") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{cfg_path}:1: expected a JSON object")
    cfg = dict(cfg)
    if "quantization_config" not in cfg:
        for name in SMALL_FILES[:3]:
            p = os.path.join(snap, name)
            if os.path.isfile(p):
                q = _read_json(p, MAX_CONFIG_BYTES, "quantization config")
                if isinstance(q, dict):
                    cfg["quantization_config"] = _modelopt(q) if name == "hf_quant_config.json" else q
                break
    dtypes = record.get("dtypes") or {}
    dominant = max(dtypes, key=dtypes.__getitem__) if isinstance(dtypes, dict) and dtypes else None
    text = v if isinstance(v := cfg.get("text_config"), dict) else {}
    has_dtype = any(k in d for d in (cfg, text) for k in ("torch_dtype", "dtype"))
    if dominant in _TORCH_DTYPE and not has_dtype:
        cfg["torch_dtype"] = _TORCH_DTYPE[dominant]
    try:
        facts = parse_config(cfg, repo, "hub", None)
    except ValueError as e:
        raise ConfigError(f"{cfg_path} (from {record.get('endpoint', 'the Hub')}/{repo}): {e}") from None
    w = record["weights"]
    if isinstance(w.get("bytes"), int) and w["bytes"] > 0:
        facts = with_checkpoint_bytes(facts, cfg, w["bytes"], str(w.get("source") or "hub"))
    rev = revision or "main"
    origin = (
        f"the Hub ({record.get('endpoint')}/{repo}, revision {rev} = commit {commit}, {how}); "
        f"config in {snap}, file list in {record_path(cache, repo, commit)}"
    )
    return facts._replace(revision=commit, origin=origin)


def _modelopt(doc: dict[str, Any]) -> dict[str, Any]:
    """NVIDIA ModelOpt's hf_quant_config.json as a quantization_config: its method and bits, and what
    :mod:`.weights` sizes the checkpoint from (the algorithm, its group size, the excluded modules)."""
    q = v if isinstance(v := doc.get("quantization"), dict) else {}
    algo = str(q.get("quant_algo") or "").upper()
    bits = 8 if "FP8" in algo or "INT8" in algo else 4 if "FP4" in algo or "INT4" in algo else None
    out: dict[str, Any] = {"quant_method": "modelopt", **({"bits": bits} if bits else {})}
    if algo:
        out["quant_algo"] = algo
    if type(q.get("group_size")) is int:
        out["group_size"] = q["group_size"]
    exclude = q.get("exclude_modules")
    if isinstance(exclude, list):
        out["exclude_modules"] = [m for m in exclude if isinstance(m, str)]
    return out


JSON_CAP = 64 * 2**20  # a config or a safetensors index; a planted FIFO or /dev/zero in the cache is an error


def _read_json(path: str, what: str) -> Any:
    """A small JSON file fetched into the cache, through the bounded reader (a regular file, capped)."""
    from ..runtime.files import read_bounded

    try:
        return json.loads(read_bounded(path, JSON_CAP).decode("utf-8"))
    except RecursionError:
        raise ConfigError(f"{what}: cannot read it as JSON: nested too deeply") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{what}: cannot read it as JSON: {e}") from None


def _choose_weights(files: dict[str, int | None], index: dict[str, Any] | None, repo: str) -> list[str]:
    """The safetensors files vLLM loads: the index's shards, else the top-level ``*.safetensors``
    (Mistral's ``consolidated*`` left out where the Hugging Face layout is there too)."""
    if index is not None:
        wm = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise ConfigError(f"{repo}: {INDEX} on the Hub has no weight_map object")
        shards = set()
        for tensor, shard in wm.items():
            if type(shard) is not str or not shard or shard.startswith("/") or ".." in shard.split("/"):
                raise ConfigError(f"{repo}: {INDEX}: weight_map.{tensor}: not a shard file name")
            shards.add(shard)
        missing = sorted(shards - set(files))
        if missing:
            raise ConfigError(
                f"{repo}: {INDEX} names {len(missing)} shard(s) the repository does not have: "
                + ", ".join(missing[:5])
            )
        return sorted(shards)
    top = sorted(f for f in files if f.endswith(".safetensors") and "/" not in f)
    hf = [f for f in top if not f.startswith("consolidated")]
    return hf or top


def _no_weights(files: dict[str, int | None], repo: str, ep: str) -> HwprofileError:
    pickles = sorted(f for f in files if PICKLE.search(f) and "/" not in f)
    if pickles:
        return RefusedError(
            f"{repo}: the repository ships only pickle weights ({', '.join(pickles[:3])}), no safetensors: "
            "hwprofile plans from safetensors, whose sizes and dtypes the Hub gives without a download "
            f"(and which run no code when loaded). Look for a safetensors version of it on {shown(ep)} (or a "
            "'refs/pr/N' of the repository adding one: --revision refs/pr/N), or download and convert it "
            "and give the directory"
        )
    ggufs = sorted(f for f in files if f.endswith(".gguf"))
    what = f"only GGUF files ({', '.join(ggufs[:3])})" if ggufs else "no weight files"
    return RefusedError(
        f"{repo}: the repository has {what}, no safetensors: give the original model's name, or a "
        "local directory with safetensors weights"
    )


def _header_dtypes(api: HfApi, repo: str, commit: str, shards: list[str], t: float) -> dict[str, int]:
    """Parameters per safetensors dtype over a sample of the shards (their headers only)."""
    counts: dict[str, int] = {}
    for shard in shards[:MAX_HEADERS]:
        with _bounded(HEADER_CAP, f"the safetensors header of {shard}"):
            meta = api.parse_safetensors_file_metadata(repo, shard, revision=commit, timeout=t)
        for dtype, n in (meta.parameter_count or {}).items():
            counts[str(dtype)] = counts.get(str(dtype), 0) + int(n)
    return counts


def _ambiguous(cfg: dict[str, Any], weights_bytes: int, repo: str) -> bool:
    """The sizes alone do not say the dtype: config.json names none, or its estimate at the
    config's dtype and bits is far from the files' bytes (a float32 checkpoint, a quantization
    config.json does not declare)."""
    from .hfconfig import parse_config

    text = v if isinstance(v := cfg.get("text_config"), dict) else {}
    if (
        not any(k in d for d in (cfg, text) for k in ("torch_dtype", "dtype"))
        and "quantization_config" not in cfg
    ):
        return True
    try:
        estimate = parse_config(cfg, repo, "hub", None).weights_bytes
    except ValueError:
        return False  # parse_config says what is wrong, later
    return bool(estimate) and not 0.6 <= weights_bytes / estimate <= 1.5


def _fetch(
    repo: str, revision: str | None, cache: str, ep: str, t: float, cancelled: threading.Event, label: str
) -> str:
    """Ask the Hub; keep the small files and the file list in the cache; return the commit.
    ``label`` names the model in messages (``model ORG/NAME@REV``)."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import disable_progress_bars
    from huggingface_hub.utils import logging as hf_logging

    disable_progress_bars()  # hwprofile says what it fetched itself
    hf_logging.set_verbosity_error()
    _install_bounds(cancelled)
    api = HfApi(endpoint=ep)
    with _bounded(API_CAP, "the model's file list"):
        info = api.model_info(repo, revision=revision, files_metadata=True, timeout=t)
    commit = str(info.sha or "")
    if not COMMIT.fullmatch(commit):
        raise OperationError(
            f"{label}: {shown(ep)} answered without a commit for revision {revision or 'main'}"
        )
    check_cache(cache, repo, commit, revision, label)
    if _looked_up_before(cache, repo, revision, commit, cancelled, label):
        return commit  # this commit was looked up before: its files are in the cache
    files = _file_list(info, label, ep)

    def get(name: str) -> str:
        return _download_small(name, files.get(name), repo, commit, cache, ep, t, label)

    cfg_file = get("config.json")
    for name in SMALL_FILES:
        if name in files:
            get(name)
    index = None
    if INDEX in files:
        index = _read_json(get(INDEX), f"{label}: {INDEX} on the Hub")
    weights = _choose_weights(files, index, label)
    if not weights:
        raise _no_weights(files, label, ep)
    known, total, source = _listed_bytes(files, weights, index)
    cfg = _read_json(cfg_file, f"{label}: config.json on the Hub")
    dtypes: dict[str, int] | None = None
    if isinstance(cfg, dict) and known and _ambiguous(cfg, total, repo):
        dtypes = _header_dtypes(api, repo, commit, weights, t)
        total, source = _served_bytes(dtypes, total, source, len(weights))
    if cancelled.is_set():
        return commit  # past the deadline: the caller has already said so; leave no record
    record = {
        "schema": RECORD_SCHEMA,
        "repo": repo,
        "revision": revision or "main",
        "commit": commit,
        "endpoint": shown(ep),
        "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gated": bool(info.gated),
        "files": files,
        "weights": {"files": weights, "bytes": total, "source": source},
        "dtypes": dtypes,
    }
    _save_record(cache, repo, revision, commit, record, label)
    return commit


def _save_record(
    cache: str, repo: str, revision: str | None, commit: str, record: dict[str, Any], label: str
) -> None:
    """Keep the look-up's record in the cache, and point the revision at its commit."""
    folder = os.path.basename(repo_folder(cache, repo))
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    _cache_write(cache, (folder, RECORD_DIR), commit + ".json", text, label)
    _write_ref(cache, repo, revision or "main", commit, label)


def _looked_up_before(
    cache: str, repo: str, revision: str | None, commit: str, cancelled: threading.Event, label: str
) -> bool:
    """Whether ``commit`` was looked up before (its record and config.json are in the cache); the
    revision is then pointed at it, unless the look-up is past its deadline."""
    snap = os.path.join(repo_folder(cache, repo), "snapshots", commit)
    if load_record(cache, repo, commit) is not None and os.path.isfile(os.path.join(snap, "config.json")):
        if not cancelled.is_set():
            _write_ref(cache, repo, revision or "main", commit, label)
        return True
    return False


def _listed_bytes(
    files: dict[str, int | None], weights: list[str], index: dict[str, Any] | None
) -> tuple[bool, int, str]:
    """Whether the file list gives every weight file's size, their total (0 if not) and its source."""
    sizes = [files.get(w) for w in weights]
    known = all(isinstance(s, int) and s > 0 for s in sizes)
    total = sum(s for s in sizes if isinstance(s, int)) if known else 0
    source = (
        ("hub safetensors index" if index is not None else "hub safetensors files") if known else "estimate"
    )
    return known, total, source


def _file_list(info: ModelInfo, label: str, ep: str) -> dict[str, int | None]:
    """The repository's files and their sizes (None: not said) from the Hub's model info; it must
    hold a config.json."""
    files: dict[str, int | None] = {}
    for s in info.siblings or ():
        size = s.lfs.size if s.lfs is not None else s.size
        if not isinstance(s.rfilename, str):
            raise OperationError(f"{label}: {shown(ep)} answered a file list with a name that is not text")
        files[s.rfilename] = size if type(size) is int and size >= 0 else None
    if "config.json" not in files:
        raise ConfigError(
            f"{label}: the repository on {shown(ep)} has no config.json (not a Transformers model, or only GGUF "
            "or adapter files?): give the base model's name, or a local directory with a config.json"
        )
    return files


def _download_small(
    name: str, size: int | None, repo: str, commit: str, cache: str, ep: str, t: float, label: str
) -> str:
    """Download one configuration file of at most ``SMALL_CAP`` bytes into the cache; return its
    path. A failed download leaves nothing behind."""
    from huggingface_hub import hf_hub_download

    if size is not None and size > SMALL_CAP:
        raise ConfigError(
            f"{label}: {name} is {size} bytes by the repository's file list, more than the {SMALL_CAP} "
            "bytes hwprofile reads of a configuration file"
        )
    cap = SMALL_CAP if size is None else size
    blobs = os.path.join(repo_folder(cache, repo), "blobs")
    before = _incomplete(blobs)
    try:
        with _bounded(cap, f"{name} (the file list says {size} bytes)" if size is not None else name):
            return str(
                hf_hub_download(repo, name, revision=commit, cache_dir=cache, endpoint=ep, etag_timeout=t)
            )
    except BaseException:
        _remove_incomplete(blobs, before)  # a failed download leaves nothing behind
        raise


def _served_bytes(dtypes: dict[str, int], total: int, source: str, n_weights: int) -> tuple[int, str]:
    """The weights' bytes as vLLM serves them, given the dtypes the safetensors headers name, and
    the source that says so."""
    byte_count = sum(n * _DTYPE_BYTES.get(d, 2) for d, n in dtypes.items())
    f32 = dtypes.get("F32", 0) * 4
    if byte_count and f32 * 2 > byte_count:  # float32 on disk is served in 16 bits (vLLM's auto)
        total -= int(total * f32 / byte_count / 2)
        source += ", float32 served as 16-bit"
    source += f" (dtypes from {min(n_weights, MAX_HEADERS)} safetensors header(s))"
    return total, source


# -- every answer bounded ------------------------------------------------------------------------


class AnswerTooLarge(OperationError):
    """The Hub sent more than hwprofile reads of that answer."""


class _LookUpCancelled(OperationError):
    """The look-up's deadline passed: the transfer stops at its next bytes."""


_BOUND = threading.local()  # the cap of the answers this thread reads now (None: not hwprofile's)
_CANCEL: dict[int, threading.Event] = {}  # thread id → its look-up's cancel event


class _bounded:
    """Within it, every answer huggingface_hub reads on this thread is cut at ``cap`` bytes."""

    def __init__(self, cap: int, what: str) -> None:
        self.cap, self.what = cap, what

    def __enter__(self) -> None:
        self.saved = getattr(_BOUND, "cap", None)
        _BOUND.cap = (self.cap, self.what)

    def __exit__(self, *exc: object) -> None:
        _BOUND.cap = self.saved


def _install_bounds(cancelled: threading.Event) -> None:
    """A response hook on huggingface_hub's one HTTP client: the body of each answer read on a
    thread inside :class:`_bounded` is counted as it arrives and cut past the cap, or at the next
    bytes after the look-up's deadline (an endless or trickling answer)."""
    import httpx2
    from huggingface_hub.utils import get_session

    _CANCEL[threading.get_ident()] = cancelled

    class Capped(httpx2.SyncByteStream):
        def __init__(
            self, inner: httpx2.SyncByteStream, cap: int, what: str, event: threading.Event | None
        ) -> None:
            self.inner, self.cap, self.what, self.event = inner, cap, what, event

        def __iter__(self) -> Iterator[bytes]:
            n = 0
            for chunk in self.inner:
                n += len(chunk)
                if self.event is not None and self.event.is_set():
                    raise _LookUpCancelled(f"{self.what}: the look-up's deadline passed")
                if n > self.cap:
                    raise AnswerTooLarge(
                        f"the Hub sent more than {self.cap} bytes for {self.what}: refused (an endless or "
                        "lying answer; check HF_ENDPOINT)"
                    )
                yield chunk

        def close(self) -> None:
            close = getattr(self.inner, "close", None)
            if close is not None:
                close()

    def hook(response: httpx2.Response) -> None:
        bound = getattr(_BOUND, "cap", None)
        if bound is None or not isinstance(response.stream, httpx2.SyncByteStream):
            return
        response.stream = Capped(response.stream, bound[0], bound[1], _CANCEL.get(threading.get_ident()))

    session = get_session()
    hooks = session.event_hooks
    if not any(getattr(h, "__name__", "") == "hwprofile_bound" for h in hooks["response"]):
        hook.__name__ = "hwprofile_bound"
        hooks["response"].append(hook)
        session.event_hooks = hooks


def _incomplete(blobs: str) -> set[str]:
    try:
        return {n for n in os.listdir(blobs) if n.endswith(".incomplete")}
    except OSError:
        return set()


def _remove_incomplete(blobs: str, before: set[str]) -> None:
    """The partial downloads that appeared since ``before`` (huggingface_hub keeps them to resume)."""
    for name in _incomplete(blobs) - before:
        try:
            st = os.lstat(os.path.join(blobs, name))
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                os.unlink(os.path.join(blobs, name))
        except OSError:
            pass


# -- errors --------------------------------------------------------------------------------------


def _hub_error(e: BaseException, repo: str, revision: str | None, ep: str, what: str) -> HwprofileError:
    """The hwprofile error, with the fix, of what huggingface_hub or the network raised."""
    if isinstance(e, AnswerTooLarge):
        return OperationError(f"{what} {repo}" + (f"@{revision}" if revision else "") + f": {e}")
    if isinstance(e, HwprofileError):
        return e
    import httpx2  # huggingface_hub's HTTP client
    from huggingface_hub import errors as hf

    name = f"{what} {repo}" + (f"@{revision}" if revision else "")
    first = _scrub(str(e).strip().split("\n")[0])[:300]
    try:  # HF_TOKEN, else the token file of `hf auth login`: whether there is one, never what
        from huggingface_hub import get_token

        token = bool(get_token())
    except Exception:
        token = bool(os.environ.get("HF_TOKEN"))
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, hf.GatedRepoError) or (
        status in (401, 403) and not isinstance(e, hf.RepositoryNotFoundError)
    ):
        why = "the token given (HF_TOKEN) has no access to it" if token else "no token was given"
        return RefusedError(
            f"{name}: gated on the Hub (HTTP {status or 403}): {why}. Accept the license on {shown(ep)}/{repo} "
            "and set HF_TOKEN to a read token of that account (huggingface.co/settings/tokens)"
        )
    if isinstance(e, hf.RepositoryNotFoundError):
        private = " (private: set HF_TOKEN to a token that can read it)" if not token else ""
        return ConfigError(f"{name}: no such model on the Hub at {shown(ep)}{private}")
    if isinstance(e, hf.RevisionNotFoundError):
        return ConfigError(
            f"{name}: no revision {revision or 'main'} in {shown(ep)}/{repo} (a branch, a tag or a commit)"
        )
    if isinstance(e, hf.RemoteEntryNotFoundError):
        return ConfigError(f"{name}: a file the repository lists is not on the Hub: {first}")
    if status == 429:
        retry = (getattr(getattr(e, "response", None), "headers", None) or {}).get("Retry-After")
        when = f", retry after {retry} s" if retry else ""
        return OperationError(
            f"{name}: the Hub at {shown(ep)} is rate limiting this host (HTTP 429{when}): wait and plan again"
            + ("" if token else ", or set HF_TOKEN (signed-in requests get a higher limit)")
        )
    if isinstance(status, int) and status >= 500:
        return OperationError(f"{name}: the Hub at {shown(ep)} answered HTTP {status}: plan again later")
    if isinstance(e, httpx2.TimeoutException):
        return OperationError(_timeout_message(name, ep))
    if isinstance(e, hf.OfflineModeIsEnabled):
        return OperationError(f"{name}: HF_HUB_OFFLINE is set: the Hub is not asked")
    if isinstance(e, httpx2.HTTPError | hf.LocalEntryNotFoundError | OSError):
        return OperationError(
            f"{name}: cannot reach the Hub at {shown(ep)} ({first}): check the network and proxy (HTTPS_PROXY), "
            "set HF_ENDPOINT to a mirror, or download the model on a connected host and give its directory; "
            "HF_HUB_OFFLINE=1 plans from the cache and the built-in catalog only"
        )
    return OperationError(f"{name}: the Hub look-up at {shown(ep)} failed: {type(e).__name__}: {first}")


def _timeout_message(name: str, ep: str) -> str:
    t = timeout_s()
    return (
        f"{name}: the Hub at {shown(ep)} did not answer in time ({t:g} s a request, {DEADLINE_FACTOR * t:g} s "
        "in all): check the network or HF_ENDPOINT; a slow link can raise HF_HUB_ETAG_TIMEOUT (seconds); "
        "HF_HUB_OFFLINE=1 plans from the cache and the built-in catalog only"
    )


# -- the entry -----------------------------------------------------------------------------------

_MEMO: dict[tuple[str, str, str, str | None], ModelFacts] = {}  # one look-up per process and name


def from_cache(repo: str, revision: str | None, cache: str, how: str) -> ModelFacts | None:
    """The facts of an earlier look-up, from the cache alone (None: none was saved)."""
    commit = commit_of(cache, repo, revision)
    record = load_record(cache, repo, commit) if commit else None
    if commit is None or record is None:
        return None
    return facts_from_record(repo, cache, commit, record, how, revision)


def resolve_hub(repo: str, revision: str | None, cache: str, what: str = "model") -> ModelFacts:
    """The facts of ``repo`` at ``revision`` (default main): from the Hub, or from the cache where
    the Hub is not to be asked (``HF_HUB_OFFLINE``) or the revision is a commit already looked up."""
    ep = endpoint()
    key = (ep, cache, repo, revision)
    if key in _MEMO:
        return _MEMO[key]
    name = f"{what} {repo}" + (f"@{revision}" if revision else "")
    facts = _without_asking(repo, revision, cache, name)
    if facts is not None:
        _MEMO[key] = facts
        return facts
    t = timeout_s()  # before huggingface_hub's import, which reads it with int() and fails unnamed
    _check_hub_client(name)
    got = _fetch_within_deadline(repo, revision, cache, ep, t, name, what)
    if isinstance(got, str):
        record = load_record(cache, repo, got)
        if record is None:
            raise OperationError(f"{name}: the file list fetched could not be read back from {cache}")
        facts = facts_from_record(repo, cache, got, record, "asked now", revision)
        _MEMO[key] = facts
        return facts
    if isinstance(got, OperationError):  # the Hub not reached: an earlier look-up still plans, said so
        facts = from_cache(repo, revision, cache, f"from the cache: {shown(ep)} did not answer")
        if facts is not None:
            import logging

            logging.getLogger("hwprofile").warning("%s; planned from the cache, from an earlier look-up", got)
            _MEMO[key] = facts
            return facts
    raise got


def _without_asking(repo: str, revision: str | None, cache: str, name: str) -> ModelFacts | None:
    """The facts from the cache where the Hub is not to be asked: ``HF_HUB_OFFLINE`` (refused when
    the cache lacks them), or a commit already looked up; None: ask the Hub."""
    if offline():
        facts = from_cache(repo, revision, cache, "from the cache: HF_HUB_OFFLINE is set, the Hub not asked")
        if facts is None:
            raise ConfigError(
                f"{name}: HF_HUB_OFFLINE is set, so only the cache ({cache}) and the built-in catalog are "
                "read, and neither has it: plan once online (it fetches the config and the file list, no "
                "weights), or give a local directory or a catalog name"
            )
        return facts
    if revision and COMMIT.fullmatch(revision):
        return from_cache(repo, revision, cache, "from the cache: a commit does not change")
    return None


def _check_hub_client(name: str) -> None:
    """Refuse, saying why, an ``HF_HUB_DOWNLOAD_TIMEOUT`` huggingface_hub cannot read, and a missing
    huggingface_hub or one that refuses the environment's settings at its import."""
    raw = os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT")
    if raw:
        try:
            int(raw)
        except ValueError:
            raise ConfigError(
                f"HF_HUB_DOWNLOAD_TIMEOUT={raw[:40]!r}: expected a whole number of seconds (huggingface_hub "
                "reads it with int()); unset it for the default"
            ) from None
    try:
        import httpx2  # noqa: F401
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise RefusedError(
            f"{name}: not in the cache or the catalog, and asking the Hub needs huggingface_hub, which is "
            "not installed: pip install huggingface_hub (it comes with vLLM), or give a local directory"
        ) from None
    except ValueError as e:  # a setting huggingface_hub reads at its import
        raise ConfigError(
            f"{name}: huggingface_hub refused a setting of the environment (HF_*): {e}"
        ) from None


def _fetch_within_deadline(
    repo: str, revision: str | None, cache: str, ep: str, t: float, name: str, what: str
) -> str | HwprofileError:
    """:func:`_fetch` on a worker thread given ``DEADLINE_FACTOR * t`` seconds: the commit, or the
    error to say (a look-up past its deadline is cancelled and its partial downloads removed)."""
    out: dict[str, Any] = {}
    cancelled = threading.Event()
    blobs = os.path.join(repo_folder(cache, repo), "blobs")
    partial = _incomplete(blobs)

    def work() -> None:
        try:
            out["commit"] = _fetch(repo, revision, cache, ep, t, cancelled, name)
        except BaseException as e:  # handed to the caller, which says it the one way
            out["error"] = e
        finally:
            _CANCEL.pop(threading.get_ident(), None)

    worker = threading.Thread(target=work, name="hwprofile-hub", daemon=True)
    worker.start()
    worker.join(DEADLINE_FACTOR * t)
    if worker.is_alive():
        cancelled.set()  # the transfer stops at its next bytes; what it left is removed now
        _remove_incomplete(blobs, partial)
        return OperationError(_timeout_message(name, ep))
    if "error" in out:
        return _hub_error(out["error"], repo, revision, ep, what)
    return str(out["commit"])
