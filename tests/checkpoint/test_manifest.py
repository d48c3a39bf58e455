"""Pure: rank records -> a complete save or an error naming rank and file; layout comparison on resume."""

from __future__ import annotations

import dataclasses
import json

import pytest

from verl_patches.checkpoint.manifest import (
    CheckpointIncomplete,
    FileRecord,
    LayoutChangeError,
    RankRecord,
    TrainLayout,
    check_rank_records,
    check_resume_layout,
    layout_differences,
    manifest_content,
    manifest_json,
    parse_manifest,
    parse_rank_record,
    with_signature,
)

TP2EP2 = TrainLayout(tp=2, pp=1, ep=2, dp=2)


def records(layout: TrainLayout) -> list[RankRecord]:
    out = []
    for r in range(layout.world_size):
        out.append(
            RankRecord(
                rank=r,
                layout=layout,
                tp_rank=r % layout.tp,
                pp_rank=0,
                ep_rank=(r // layout.tp) % layout.ep,
                dp_rank=r // layout.tp,
                files={f"rng/rank_{r:05d}.pt": 100 + r},
                sha256={f"rng/rank_{r:05d}.pt": f"{r:064x}"},
            )
        )
    return out


def sizes(recs: list[RankRecord]) -> dict[str, int]:
    return {n: s for r in recs for n, s in r.files.items()}


def test_layout_json_round_trip_and_description() -> None:
    lay = TrainLayout(tp=4, pp=8, ep=8, dp=8, num_layer_list=(7, 7, 8, 8, 8, 8, 8, 7), moe_tp_extend_ep=True)
    assert TrainLayout.from_json(json.loads(json.dumps(lay.to_json()))) == lay
    assert lay.world_size == 256
    assert lay.describe() == "TP4xPP8xEP8 (DP8, 256 ranks, layers [7, 7, 8, 8, 8, 8, 8, 7], TP-extend-EP)"
    rec = records(TP2EP2)[3]
    assert RankRecord.from_json(json.loads(json.dumps(rec.to_json()))) == rec


def test_complete_records_give_the_layout() -> None:
    recs = records(TP2EP2)
    assert check_rank_records("actor", reversed(recs), sizes(recs)) == TP2EP2


def test_missing_rank_record_is_named() -> None:
    recs = records(TP2EP2)
    with pytest.raises(CheckpointIncomplete, match=r"actor: rank records \[0, 1, 3\].*missing \[2\]"):
        check_rank_records("actor", [r for r in recs if r.rank != 2], sizes(recs))
    with pytest.raises(CheckpointIncomplete, match="no rank wrote a record"):
        check_rank_records("actor", [], {})


def test_missing_or_short_file_is_named_with_its_rank() -> None:
    recs = records(TP2EP2)
    s = sizes(recs)
    s["rng/rank_00001.pt"] = None
    with pytest.raises(CheckpointIncomplete, match="actor: rank 1: rng/rank_00001.pt is missing"):
        check_rank_records("actor", recs, s)
    s = sizes(recs)
    s["rng/rank_00003.pt"] = 5
    with pytest.raises(CheckpointIncomplete, match="rank 3: rng/rank_00003.pt has 5 bytes, the rank wrote 103"):
        check_rank_records("actor", recs, s)


def test_file_without_digest_is_named() -> None:
    recs = records(TP2EP2)
    recs[2] = dataclasses.replace(recs[2], sha256={})
    with pytest.raises(CheckpointIncomplete, match="rank 2: rng/rank_00002.pt has no sha256"):
        check_rank_records("actor", recs, sizes(recs))


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda d: d.update(rank="1"), "key 'rank' must be an integer"),
        (lambda d: d.update(rank=True), "key 'rank' must be an integer"),
        (lambda d: d["layout"].update(tp=0), "key 'tp' must be an integer in 1.."),
        (lambda d: d["files"].update({"../../etc/passwd": 1}), "leaves or re-enters its folder"),
        (lambda d: d["files"].update({"/etc/passwd": 1}), "is absolute"),
        (lambda d: d["sha256"].update({"rng/rank_00001.pt": "abc"}), "expected a sha256"),
        (lambda d: d["layout"].update(evil=1), "unknown key 'evil'"),
    ],
)
def test_rank_record_is_schema_checked(mutate, needle) -> None:
    d = records(TP2EP2)[1].to_json()
    mutate(d)
    with pytest.raises(CheckpointIncomplete, match=needle):
        parse_rank_record(json.dumps(d), "r.json")


def test_ranks_disagreeing_on_layout_is_an_error() -> None:
    recs = records(TP2EP2)
    recs[1] = dataclasses.replace(recs[1], layout=dataclasses.replace(TP2EP2, ep=4, dp=2))
    with pytest.raises(CheckpointIncomplete, match="rank 1 saved at TP2xPP1xEP4"):
        check_rank_records("actor", recs, sizes(recs))


def test_duplicate_or_out_of_range_rank_is_an_error() -> None:
    recs = records(TP2EP2)
    with pytest.raises(CheckpointIncomplete):
        check_rank_records("actor", recs + [recs[0]], sizes(recs))
    extra = dataclasses.replace(recs[0], rank=4)
    with pytest.raises(CheckpointIncomplete):
        check_rank_records("actor", recs[1:] + [extra], sizes(recs))


SHA = "ab" * 32


def good_manifest() -> dict:
    return with_signature(
        manifest_json(
            4, {"actor": TP2EP2, "critic": None}, {"data.pt": FileRecord(10, SHA)}, {"total_training_steps": 9}
        ),
        "cd" * 32,  # its shape only: whether it matches the run's secret is the reader's check (commit)
    )


def test_manifest_parse_errors_name_file_and_key() -> None:
    data = parse_manifest(json.dumps(good_manifest()), "x/checkpoint.json")
    assert data.step == 4 and data.roles == {"actor": TP2EP2, "critic": None}
    assert data.files == {"data.pt": FileRecord(10, SHA)} and data.extra == {"total_training_steps": 9}
    with pytest.raises(CheckpointIncomplete, match=r"x/checkpoint.json: line 1: not valid JSON"):
        parse_manifest("{", "x/checkpoint.json")
    with pytest.raises(CheckpointIncomplete, match="key 'step' missing"):
        parse_manifest(json.dumps({"version": 3, "roles": {}, "files": {}}), "x")
    with pytest.raises(CheckpointIncomplete, match="manifest version 9"):
        parse_manifest(json.dumps({"version": 9, "step": 1, "roles": {}, "files": {}}), "x")
    with pytest.raises(CheckpointIncomplete, match="manifest version 1, this code reads 3"):
        parse_manifest(json.dumps({"version": 1, "step": 1, "roles": {}, "files": {"a": 1}}), "x")
    with pytest.raises(CheckpointIncomplete, match="manifest version 2, this code reads 3"):  # before signatures
        parse_manifest(json.dumps({**good_manifest(), "version": 2}), "x")


@pytest.mark.parametrize(
    "signature",
    [None, "cd" * 32, {"hmac_sha256": "CD" * 32}, {"hmac_sha256": "cd" * 31}, {"sha256": "cd" * 32}, {}],
)
def test_an_unsigned_or_malformed_signature_is_refused_in_one_line(signature) -> None:
    d = good_manifest()
    if signature is None:
        d.pop("signature")
    else:
        d["signature"] = signature
    with pytest.raises(CheckpointIncomplete, match="^x/checkpoint.json: key 'signature' missing or not") as e:
        parse_manifest(json.dumps(d), "x/checkpoint.json")
    assert "\n" not in str(e.value)


def test_the_signed_content_is_every_key_but_the_signature_whatever_the_layout() -> None:
    d = good_manifest()
    m = parse_manifest(json.dumps(d, indent=3), "x")
    assert m.signature == "cd" * 32
    assert m.content == manifest_content(d) == manifest_content({k: v for k, v in d.items() if k != "signature"})
    assert m.content == parse_manifest(json.dumps(dict(reversed(list(d.items())))), "x").content
    assert b"signature" not in m.content and b'"total_training_steps":9' in m.content
    changed = {**d, "total_training_steps": 10}
    assert parse_manifest(json.dumps(changed), "x").content != m.content  # every key is covered, extras too


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda d: d["files"].update({"../outside.pt": {"bytes": 1, "sha256": SHA}}), "leaves or re-enters"),
        (lambda d: d["files"].update({"/abs.pt": {"bytes": 1, "sha256": SHA}}), "is absolute"),
        (lambda d: d["files"].update({"a//b": {"bytes": 1, "sha256": SHA}}), "leaves or re-enters"),
        (lambda d: d["files"].update({"a\\..\\b": {"bytes": 1, "sha256": SHA}}), "backslash"),
        (lambda d: d["files"].update({"checkpoint.json": {"bytes": 1, "sha256": SHA}}), "lists the manifest itself"),
        (lambda d: d["files"]["data.pt"].update(bytes=-1), "key 'bytes' must be an integer"),
        (lambda d: d["files"]["data.pt"].update(sha256="AB" * 32), "expected a sha256"),
        (lambda d: d["files"].update({"x": 5}), "expected a JSON object"),
        (lambda d: d["roles"].update({"..": None}), "leaves or re-enters"),
        (lambda d: d["roles"].update({"a/b": None}), "single name"),
        (lambda d: d["roles"]["actor"].update(dp="2"), "key 'dp' must be an integer"),
        (lambda d: d.update(step=10**12), "key 'step' must be an integer in 0..999999999999"),
        (lambda d: d.update(step=True), "key 'step' missing or not a int"),
        (lambda d: d.update(step=4.0), "key 'step' missing or not a int"),
    ],
)
def test_manifest_schema_refusals_are_one_line(mutate, needle) -> None:
    d = good_manifest()
    mutate(d)
    with pytest.raises(CheckpointIncomplete, match=needle) as e:
        parse_manifest(json.dumps(d), "s/checkpoint.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("s/checkpoint.json")


@pytest.mark.parametrize(
    "text,needle",
    [
        (b'{"version": 2, "version": 2}', "duplicate key 'version'"),
        (b'{"version": NaN}', "NaN is not a JSON number"),
        (b'{"step": ' + b"9" * 5000 + b"}", "a number of 5000 digits"),
        (b"[" * 100000 + b"]" * 100000, "nested deeper than 64"),
        (b"\xff\xfe{}", "not UTF-8"),
    ],
)
def test_manifest_strict_json(text, needle) -> None:
    with pytest.raises(CheckpointIncomplete, match=needle):
        parse_manifest(text, "s/checkpoint.json")


def test_same_layout_resumes_silently_and_dp_change_is_supported() -> None:
    assert check_resume_layout(TP2EP2, TP2EP2, "ckpt") == ""
    note = check_resume_layout(TP2EP2, dataclasses.replace(TP2EP2, dp=4), "ckpt")
    assert "data-parallel size changed 2 -> 4" in note


@pytest.mark.parametrize(
    "field,value",
    [("tp", 1), ("pp", 2), ("ep", 4), ("cp", 2), ("moe_tp_extend_ep", True), ("use_distributed_optimizer", False)],
)
def test_other_layout_changes_name_both_layouts_and_the_conversion(field, value) -> None:
    running = dataclasses.replace(TP2EP2, **{field: value})
    with pytest.raises(LayoutChangeError) as e:
        check_resume_layout(TP2EP2, running, "/ck/global_step_4")
    msg = str(e.value)
    assert TP2EP2.describe() in msg and running.describe() in msg
    assert f"{field} " in msg
    assert "convert_ckpt_deepseek3.py --reverse --load-dir /ck/global_step_4/actor" in msg
    assert "tensor_model_parallel_size=2" in msg and "expert_model_parallel_size=2" in msg


def test_tp2ep2_to_ep4_is_refused_with_both_layouts() -> None:
    with pytest.raises(LayoutChangeError, match=r"TP2xPP1xEP2 \(DP2, 4 ranks\).*TP1xPP1xEP4 \(DP4, 4 ranks\)"):
        check_resume_layout(TP2EP2, TrainLayout(tp=1, pp=1, ep=4, dp=4), "ck")


def test_layer_list_matters_only_with_pipeline_stages() -> None:
    a = TrainLayout(tp=1, pp=2, ep=1, dp=1, num_layer_list=(1, 2))
    assert layout_differences(a, dataclasses.replace(a, num_layer_list=(2, 1))) == ["num_layer_list (1, 2) -> (2, 1)"]
    b = TrainLayout(tp=1, pp=1, ep=1, dp=1)
    assert layout_differences(b, dataclasses.replace(b, num_layer_list=(3,))) == []
