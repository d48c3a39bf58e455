# Atlas A3 image for the overlay: CANN 8.2.RC1 (A3), Python 3.11, torch 2.5.1 + torch_npu 2.5.1.post1,
# jemalloc, apex for Ascend at one commit, the upstream sources exactly as sources.lock pins them,
# requirements.txt, vllm-ascend's kernels built from the pinned sdist.
# UNTESTED ON HARDWARE: neither an NPU nor a docker engine was available where this was written; it is
# checked statically (tests/launch/test_dockerfile.py). Build and run it as docs/a3-cluster-guide.md, "The container", says:
#   docker build -t verl-overlay-a3 --build-arg APEX_COMMIT=<40-hex commit of gitcode.com/Ascend/apex> .
# Air-gapped: on a connected machine run `bash setup_sources.sh --export-cache sources-cache`, put that
# folder next to this file and build with --build-arg SOURCES_CACHE=sources-cache.
#
# Every reference is fixed: the base image by its exact release tag (or by digest, below), apex by commit,
# the Python packages by requirements.txt's pins (tests/launch/test_dockerfile.py compares them), the upstream
# sources and the kernels' sdist by sources.lock's commits and hashes.

# By exact tag: the digest could not be read where this was written (no route to quay.io). Pin it after the
# first pull: `docker inspect --format '{{index .RepoDigests 0}}' quay.io/ascend/cann:8.2.rc1-a3-openeuler22.03-py3.11`
# prints quay.io/ascend/cann@sha256:...; build with --build-arg CANN_IMAGE=<that>.
ARG CANN_IMAGE=quay.io/ascend/cann:8.2.rc1-a3-openeuler22.03-py3.11
FROM ${CANN_IMAGE}

ARG CANN_IMAGE
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG SOURCES_CACHE=
# apex for Ascend is built from source; its location is a build argument so a mirror can be used.
ARG APEX_GIT_URL=https://gitcode.com/Ascend/apex.git
# The commit to build, required: the vendor builds gitcode's master branch as it was on its release, a commit
# that could not be read where this file was written (no route to gitcode.com; the GitHub mirror
# github.com/Ascend/apex ends at 49a7994e of 2023-11-23, whose scripts/build.sh accepts Python 3.7-3.10, not
# this image's 3.11). Resolve it once and keep it with the image tag (docs/a3-cluster-guide.md, "The container").
ARG APEX_COMMIT
ENV PIP_INDEX_URL=${PIP_INDEX_URL} \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.base.name="${CANN_IMAGE}" \
      org.opencontainers.image.title="verl-overlay-a3" \
      verl-overlay.apex.url="${APEX_GIT_URL}" \
      verl-overlay.apex.commit="${APEX_COMMIT}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Refuse an unpinned apex before anything is downloaded.
RUN [[ "${APEX_COMMIT:-}" =~ ^[0-9a-f]{40}$ ]] \
 || { echo "Dockerfile: APEX_COMMIT='${APEX_COMMIT:-}': give --build-arg APEX_COMMIT=<the 40-hex commit of ${APEX_GIT_URL} to build> (docs/a3-cluster-guide.md, The container)" >&2; exit 2; }

# The CANN image's openEuler repositories move versions under one name; pinning them would break builds.
# hadolint ignore=DL3033
RUN yum install -y git gcc gcc-c++ make cmake patch jemalloc jemalloc-devel iproute && yum clean all

# Device stack first: everything else is resolved against these versions (requirements.txt's pins).
RUN python3 -m pip install torch==2.5.1 torch-npu==2.5.1.post1 torchvision==0.20.1

# apex for Ascend at APEX_COMMIT (Megatron's FusedAdam name; our patch points it at MindSpeed's fused AdamW).
# Its build script takes NVIDIA's apex at the one commit that apex commit names.
RUN git clone -q "${APEX_GIT_URL}" /tmp/apex \
 && git -C /tmp/apex checkout -q --detach "${APEX_COMMIT}" \
 && test "$(git -C /tmp/apex rev-parse HEAD)" = "${APEX_COMMIT}"
WORKDIR /tmp/apex
RUN bash scripts/build.sh --python=3.11 \
 && python3 -m pip install --no-deps /tmp/apex/apex/dist/apex-*.whl \
 && rm -rf /tmp/apex

WORKDIR /workspace/verl-overlay
COPY . /workspace/verl-overlay

# Upstream package folders from the lock (git mirrors or the exported cache), checked by tree hash.
RUN if [ -n "${SOURCES_CACHE}" ]; then \
      bash setup_sources.sh --route cache --cache "${SOURCES_CACHE}" --offline; \
    else \
      bash setup_sources.sh; \
    fi \
 && bash setup_sources.sh --verify

# vLLM's and vllm-ascend's dependencies (and verl's, MindSpeed's): never the packages themselves, whose code
# is the vendored folders above; their metadata and entry points are the generated .overlay_dist/.
RUN python3 -m pip install -r requirements.txt

# vllm-ascend's compiled kernels (vllm_ascend_C), built once from the pinned sdist in a temporary folder
# and installed into site-packages/vllm_ascend_kernels: the vendored vllm_ascend/ stays as locked. Its build
# tools (cmake, setuptools-scm, pybind11, ...) came with requirements.txt above.
RUN source /usr/local/Ascend/ascend-toolkit/set_env.sh \
 && python3 -m verl_patches.rollout.kernels build \
 && bash setup_sources.sh --verify

# Every process (and vLLM's model-inspection subprocess) sees the overlay and the generated metadata.
ENV PYTHONPATH=/workspace/verl-overlay:/workspace/verl-overlay/.overlay_dist

# The job's environment variables are set by the launch script, not baked into the image.
CMD ["bash", "verl_patches/scripts/train_deepseekv3_256die_random_init.sh", "--help"]
