"""The registry's getters: the registered kind, bounds and default decide; an unregistered name, or a getter of
another kind, is refused by name; a family entry covers its prefix."""

from __future__ import annotations

import pytest

from verl_patches.base import env_registry
from verl_patches.base.env_flags import EnvError
from verl_patches.base.env_registry import REGISTRY, UnregisteredVariable


def test_getters_use_the_registered_default_and_bounds() -> None:
    assert env_registry.flag("PRINT_MEMORY", {}) is False
    assert env_registry.flag("PRINT_MEMORY", {"PRINT_MEMORY": " On "}) is True
    assert env_registry.flag("VERL_PATCHES_QUIET", {}, default=True) is True  # a caller's default when unset
    assert env_registry.integer("VLLM_DP_SIZE", {}) == 1
    assert env_registry.integer("RANK", {}, default=-1) == -1
    with pytest.raises(EnvError, match=r"^RANK is not set$"):
        env_registry.integer("RANK", {})
    with pytest.raises(EnvError, match=r"^VLLM_DP_SIZE='0': must be at least 1"):
        env_registry.integer("VLLM_DP_SIZE", {"VLLM_DP_SIZE": "0"})
    with pytest.raises(EnvError, match=r"^VERL_PATCHES_VLLM_DP_BASE_PORT='65535': must be at most 65534"):
        env_registry.integer("VERL_PATCHES_VLLM_DP_BASE_PORT", {"VERL_PATCHES_VLLM_DP_BASE_PORT": "65535"})
    assert env_registry.number("VERL_OVERLAY_GIT_TIMEOUT", {}) == 600.0
    with pytest.raises(EnvError, match="expected a finite number"):
        env_registry.number("VERL_OVERLAY_GIT_TIMEOUT", {"VERL_OVERLAY_GIT_TIMEOUT": "inf"})
    assert (
        env_registry.text("RAY_AUTH_MODE", {}) == "token"
        and env_registry.text("RAY_AUTH_MODE", {"RAY_AUTH_MODE": " x "}) == "x"
    )
    assert env_registry.items("VERL_PATCHES_ALLOW_DRIFT", {"VERL_PATCHES_ALLOW_DRIFT": "a, ,b"}) == ["a", "b"]
    assert env_registry.is_set("RANK", {"RANK": " "}) is False and env_registry.is_set("RANK", {"RANK": "3"}) is True


def test_choice_and_retired() -> None:
    assert env_registry.text("VERL_PATCHES_DEVICE", {"VERL_PATCHES_DEVICE": "cpu"}) == "cpu"
    with pytest.raises(EnvError, match=r"^VERL_PATCHES_DEVICE='NPU': expected npu, cuda or cpu$"):
        env_registry.text("VERL_PATCHES_DEVICE", {"VERL_PATCHES_DEVICE": "NPU"})
    with pytest.raises(EnvError, match=r"no longer read; set VERL_PATCHES_DEVICE=cpu instead$"):
        env_registry.text("VERL_OVERLAY_DEVICE", {"VERL_OVERLAY_DEVICE": "cpu"})


def test_unregistered_names_and_other_kinds_are_refused_by_name() -> None:
    with pytest.raises(
        UnregisteredVariable,
        match=r"VERL_PATCHES_QUITE is not in .*env_registry.py \(did you mean VERL_PATCHES_QUIET\?\)",
    ):
        env_registry.flag("VERL_PATCHES_QUITE", {})
    with pytest.raises(UnregisteredVariable, match="RANK is registered as a integer, not a switch"):
        env_registry.flag("RANK", {})
    with pytest.raises(UnregisteredVariable):
        env_registry.is_set("NOT_A_VARIABLE_WE_READ", {})


def test_a_family_covers_its_prefix() -> None:
    var = env_registry.lookup("VERL_OVERLAY_GIT_MIRROR_VLLM")
    assert var is not None and var.family and var.name == "VERL_OVERLAY_GIT_MIRROR_*"
    got = env_registry.items("VERL_OVERLAY_GIT_MIRROR_VLLM", {"VERL_OVERLAY_GIT_MIRROR_VLLM": "u1,u2"})
    assert got == ["u1", "u2"]
    assert env_registry.closest("VERL_OVERLAY_GIT_MIRROR_") != "VERL_OVERLAY_GIT_MIRROR_*"  # families are not suggested


def test_every_entry_is_well_formed() -> None:
    for name, var in REGISTRY.items():
        assert name == var.name and name == name.upper() and var.doc and var.owners
        assert var.kind != env_registry.CHOICE or var.choices
        assert var.kind != env_registry.RETIRED or var.replaced_by in REGISTRY
        if var.default is not None and var.kind in (env_registry.INT, env_registry.FLOAT):
            assert var.parse(None) == var.default
            assert var.minimum is None or var.default >= var.minimum  # type: ignore[operator]
            assert var.maximum is None or var.default <= var.maximum  # type: ignore[operator]
