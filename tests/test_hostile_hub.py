"""The Hugging Face Hub and the shared Hugging Face cache as hostile inputs (tests/hostile/hub.json),
against the stand-in Hub of tests/hubstub.py made to answer endlessly, trickle, redirect and lie:
every answer read to a bound (the file list, a safetensors header, each small file held to the size
the file list gives), no partial download left behind, ``HF_HUB_ETAG_TIMEOUT`` read as
huggingface_hub reads it, names matched whole, no password of ``HF_ENDPOINT`` shown; and, as root,
another user's folders and links in the cache (``nobody``'s): nothing written through them, a clear
error (exit 2) before the first write, a sticky shared cache folder still planned in."""

from __future__ import annotations

import json
import os
import pwd
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hubstub import Hub, commit, hub_env, model_of, plan, serve, write_snapshot

CASES = json.loads((Path(__file__).parent / "hostile" / "hub.json").read_text())


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    yield from serve()


@pytest.fixture
def snapshot(host_of, tmp_path: Path) -> Path:
    return write_snapshot(host_of("a100-80g-pcie-1x"), tmp_path)


@pytest.fixture
def env(hub: Hub, tmp_path: Path, empty_root: Path) -> dict[str, str]:
    return hub_env(hub, tmp_path / "hf", empty_root, etag_timeout="10")


def leftovers(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if p.name.endswith((".incomplete", ".tmp")))


@pytest.mark.parametrize("case", CASES["answers"], ids=[c["id"] for c in CASES["answers"]])
def test_a_hostile_hub_answer_is_read_to_a_bound(hub: Hub, snapshot: Path, env, tmp_path: Path, case) -> None:
    r = plan(snapshot, {**env, **case.get("env", {})}, "--model", case["repo"])
    assert r.returncode == case["code"] and case["says"] in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.startswith(f"hwprofile: error: model {case['repo']}"), (
        r.stderr
    )
    assert not leftovers(tmp_path / "hf"), leftovers(tmp_path / "hf")  # no partial download kept
    if "bound" in case:
        part, cap = case["bound"]
        with hub.lock:
            sent = [n for p, n in hub.sent_bytes.items() if part in p]
        assert sent, hub.sent_bytes
        # what the stand-in wrote before the connection was closed: the cap, plus the socket buffers
        assert max(sent) < cap + (16 << 20), (sent, cap)


@pytest.mark.parametrize("case", CASES["environment"], ids=[c["id"] for c in CASES["environment"]])
def test_hub_settings_in_the_environment_are_checked(hub: Hub, snapshot: Path, env, case) -> None:
    r = plan(snapshot, {**env, **case["env"]}, "--model", "acme/small")
    assert r.returncode == case["code"] and case["says"] in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    if "never" in case:
        assert case["never"] not in r.stderr + r.stdout


@pytest.mark.parametrize("case", CASES["names"], ids=[c["id"] for c in CASES["names"]])
def test_names_and_revisions_match_whole(hub: Hub, snapshot: Path, env, tmp_path: Path, case) -> None:
    r = plan(snapshot, env, "--model", case["model"])
    assert r.returncode == case["code"], r.stderr
    assert "Traceback" not in r.stderr
    refs = tmp_path / "hf" / "hub" / "models--acme--small" / "refs"
    assert not [p for p in refs.rglob("*") if "\n" in p.name] if refs.exists() else True


def test_a_cached_record_of_mixed_types_is_not_trusted(hub: Hub, snapshot: Path, env, tmp_path: Path) -> None:
    first = model_of(plan(snapshot, env, "--model", "acme/small"))
    rec = tmp_path / "hf" / "hub" / "models--acme--small" / "hwprofile" / f"{commit('small-main')}.json"
    doc = json.loads(rec.read_text())
    for bad in (
        {"dtypes": {"BF16": 5, "F32": "x"}},
        {"dtypes": [1, 2]},
        {"weights": {"files": [1], "bytes": "x"}},
        {"files": {"config.json": "big"}},
    ):
        rec.write_text(json.dumps({**doc, **bad}))
        off = plan(snapshot, {**env, "HF_HUB_OFFLINE": "1"}, "--model", "acme/small")
        assert (
            off.returncode == 2 and "HF_HUB_OFFLINE is set" in off.stderr and "Traceback" not in off.stderr
        ), off.stderr
        assert model_of(plan(snapshot, env, "--model", "acme/small")) == first  # asked again, rewritten
        assert json.loads(rec.read_text()) != {**doc, **bad}


# -- another user's folders and links in a shared cache (as root) ---------------------------------

NOBODY = pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else -1


def own(p: Path, who: str | None, mode: str | None) -> None:
    if who == "nobody":
        os.chown(p, NOBODY, -1)
    if mode:
        os.chmod(p, int(mode, 8))


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's files needs root")
@pytest.mark.parametrize("case", CASES["cache"], ids=[c["id"] for c in CASES["cache"]])
def test_nothing_is_written_through_another_users_cache_folder(
    hub: Hub, snapshot: Path, env, tmp_path: Path, case
) -> None:
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    repo = cache / "models--acme--small"
    if "repo_owner" in case:
        repo.mkdir()
        for name, target in case.get("links", {}).items():
            (repo / name).symlink_to(tmp_path / target)
            if case["repo_owner"] == "nobody":
                os.lchown(repo / name, NOBODY, -1)
        own(repo, case["repo_owner"], case["repo_mode"])
    if "locks_owner" in case:
        locks = cache / ".locks"
        locks.mkdir()
        for name, target in case["locks_links"].items():
            (locks / name).symlink_to(tmp_path / target)
            os.lchown(locks / name, NOBODY, -1)
        own(locks, case["locks_owner"], case["locks_mode"])
    for rel, target in case.get("files", {}).items():  # a file of hwprofile's a link, in this user's folder
        link = repo / rel.replace("RECORD", f"{commit('small-main')}.json")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(tmp_path / target)
    for name, target in case.get("cache_links", {}).items():
        (cache / name).symlink_to(tmp_path / target)
    own(cache, case.get("cache_owner"), case.get("cache_mode"))
    if case.get("cache_is_link_to_nobody"):
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, NOBODY, -1)
        cache.rmdir()
        cache.symlink_to(theirs)
    r = plan(snapshot, env, "--model", "acme/small")
    assert list(victim.iterdir()) == []  # nothing written through a link
    if case.get("code", 2) == 0:
        assert model_of(r)["revision"] == commit("small-main")
        assert (repo / "refs" / "main").read_text() == commit("small-main")
        return
    assert r.returncode == 2, r.stderr
    assert "will not write into the Hugging Face cache" in r.stderr and "HF_HUB_CACHE" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    shutil.rmtree(victim)


def test_trusted_write_refuses_a_link_or_a_foreign_folder_on_the_way(tmp_path: Path) -> None:
    """The one safe-walk (hwprofile/runtime/files.py): a link anywhere below the base is refused, the
    file never written through it; a folder writable by others (no sticky bit) is refused."""
    from hwprofile.runtime.files import UnsafeDirectory, trusted_write

    victim = tmp_path / "victim"
    victim.mkdir()
    base = tmp_path / "base"
    (base / "a").mkdir(parents=True)
    (base / "a" / "link").symlink_to(victim)
    with pytest.raises(UnsafeDirectory, match="symbolic link"):
        trusted_write(base, ("a", "link"), "f.json", "{}")
    (base / "a" / "file").symlink_to(victim / "f.json")
    with pytest.raises(OSError, match="symbolic link"):
        trusted_write(base, ("a",), "file", "{}")
    assert list(victim.iterdir()) == []
    os.chmod(base / "a", 0o777)
    with pytest.raises(UnsafeDirectory, match="writable by other users"):
        trusted_write(base, ("a", "new"), "f.json", "{}")
    os.chmod(base / "a", 0o1777)  # sticky: others cannot replace what is this user's
    path = trusted_write(base, ("a", "new"), "f.json", "{}")
    assert Path(path).read_text() == "{}" and Path(path).stat().st_mode & 0o777 == 0o644
    assert not [p for p in (base / "a" / "new").iterdir() if p.name != "f.json"]  # no temporary left
