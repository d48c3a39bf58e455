"""verl_patches.base.overlay_settings: the typed ``overlay.*`` section, its defaults and refusals.

(That every profile's composed overlay section reads is tests/trainer/test_profiles.py's.)
"""

from __future__ import annotations

from dataclasses import fields

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from verl_patches.base.overlay_settings import (
    NOT_NULL,
    SETTINGS,
    OverlaySettingError,
    OverlaySettings,
    overlay_settings,
)

NAMES = [f.name for f in fields(OverlaySettings)]


def test_every_field_has_one_type_row_and_every_row_a_field() -> None:
    assert list(SETTINGS) == NAMES
    assert NOT_NULL <= set(NAMES)


def test_no_section_is_every_default() -> None:
    assert overlay_settings({}) == overlay_settings({"overlay": {}}) == overlay_settings({"overlay": None})
    assert overlay_settings({}) == OverlaySettings()


# a valid value of each setting, and values of other types
GOOD = {
    "profile": "a3-256die-true-weight",
    "dies_per_card": 2,
    "fused_actor_rollout_ref": True,
    "d2d_tensor_cache": False,
    "val_max_prompts": 1024,
    "vllm_dp_size": 64,
    "async_checkpoint": True,
    "rollout_mismatch_gate": {"warn": {"logprob_abs_diff_mean": 0.1}, "stop": None},
    "tiny_assets_dir": "/tmp/assets",
    "tiny_seed": 0,
    "tiny_max_operand": 2,
    "tiny_base_steps": 60,
}
OTHER_TYPES = st.one_of(
    st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False), st.text(max_size=3), st.lists(st.integers())
)


def test_every_setting_reads_its_value_from_dicts_and_omegaconf() -> None:
    want = OverlaySettings(**GOOD)
    assert overlay_settings({"overlay": GOOD}) == want
    got = overlay_settings(OmegaConf.create({"overlay": GOOD}))
    assert got == want
    assert isinstance(got.rollout_mismatch_gate["warn"], dict)  # plain data, no live OmegaConf node


@given(name=st.sampled_from(NAMES), value=OTHER_TYPES)
def test_a_value_of_another_type_is_refused_naming_the_key(name: str, value: object) -> None:
    types, minimum, _ = SETTINGS[name]
    fits = (
        isinstance(value, types)
        and not (isinstance(value, bool) and bool not in types)
        and (minimum is None or value >= minimum)  # type: ignore[operator]
    )
    if fits:
        assert getattr(overlay_settings({"overlay": {name: value}}), name) == value
        return
    with pytest.raises(OverlaySettingError) as e:
        overlay_settings({"overlay": {name: value}})
    assert e.value.key == f"overlay.{name}"
    assert str(e.value).startswith(f"overlay.{name}=") and "\n" not in str(e.value)


@pytest.mark.parametrize("name", NAMES)
def test_null_is_the_default_or_refused(name: str) -> None:
    if name in NOT_NULL:
        with pytest.raises(OverlaySettingError, match=rf"^overlay\.{name}=null: expected"):
            overlay_settings({"overlay": {name: None}})
    else:
        assert getattr(overlay_settings({"overlay": {name: None}}), name) is None


def test_an_unknown_key_is_refused_with_the_nearest() -> None:
    with pytest.raises(
        OverlaySettingError,
        match=r"^overlay\.vllm_dp_sise: not an overlay setting; did you mean "
        r"overlay\.vllm_dp_size\?$",
    ) as e:
        overlay_settings({"overlay": {"vllm_dp_size": 2, "vllm_dp_sise": 4}})
    assert e.value.key == "overlay.vllm_dp_sise"
    with pytest.raises(OverlaySettingError, match=r"^overlay\.zzz: not an overlay setting \(the overlay keys: profile"):
        overlay_settings({"overlay": {"zzz": 1}})


def test_a_section_that_is_no_mapping_is_refused() -> None:
    with pytest.raises(OverlaySettingError, match=r"^overlay=3: expected a mapping") as e:
        overlay_settings({"overlay": 3})
    assert e.value.key == "overlay"
