"""The dry run's checkpoint and validation findings (issue 34 items 1-2): the folder must be named and
absolute, this host's view of it is checked (writable, permissions the save accepts, room for the steps kept),
the cost of saving and validating is stated, and the step a resume would take is printed, read as the resume
reads it."""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path

import pytest

from fresh_python import fresh_python
from verl_patches.checkpoint import commit
from verl_patches.checkpoint.manifest import RankRecord, TrainLayout, rank_record_name
from verl_patches.checkpoint.root_access import ALLOW_SHARED_ROOT_ENV, CheckpointRootError, root_verdict
from verl_patches.launch import job
from verl_patches.launch.preflight import checkpoint as preflight_checkpoint
from verl_patches.launch.preflight import report as preflight
from verl_patches.launch.preflight.checkpoint import checkpoint_folder_findings
from verl_patches.launch.preflight.findings import FAIL, NOT_CHECKED, OK, WARN, Context, Finding, HostFacts
from verl_patches.launch.preflight.run_costs import checkpoint_step, room_needed, saves_in_run
from verl_patches.launch.preflight.validation import validation_findings
from verl_patches.launch.settings import load_settings
from verl_patches.trainer.checkpoint_folder import folder_problem
from verl_patches.trainer.config_compose import ConfigCompositionError
from verl_patches.trainer.profiles import PROFILES
from verl_patches.weights.config import make_tiny_config, official_config

ROOT = Path(__file__).resolve().parents[3]
CPU = HostFacts(device="cpu")
NPU = HostFacts(device="npu", interfaces=("lo",), npu_count=16, torch_npu_importable=True)
A3 = ("a3_256die_true_weight", "a3_256die_random_init")
TB = 10**12


@pytest.fixture(autouse=True)
def _no_path_env(monkeypatch):
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH", "CKPT_DIR"):
        monkeypatch.delenv(name, raising=False)


@cache
def cfg_for(profile: str, ckpt: str | None = None, *overrides: str):
    flags = {"CKPT_DIR": ckpt} if ckpt is not None else {}
    settings = load_settings(flags, None, environ={})
    p = PROFILES[profile]
    return preflight.compose(p.config_name, [*p.overrides, *overrides], settings, ROOT), settings


def findings(
    profile: str, ckpt: str | None = None, *overrides: str, host: HostFacts = CPU, model=None
) -> list[Finding]:
    cfg, settings = cfg_for(profile, ckpt, *overrides)
    ctx = Context(cfg=cfg, settings=settings, root=ROOT, host=host)
    return checkpoint_folder_findings(ctx, model or official_config())


def only(found: list[Finding], check: str) -> Finding:
    (hit,) = [f for f in found if f.check == check]
    return hit


def roomy_model() -> dict:
    """A model whose checkpoint step fits any test folder (kilobytes)."""
    return make_tiny_config()


# ---- the folder must be named, absolute ----------------------------------------------------------


@pytest.mark.parametrize("profile", A3)
def test_a_missing_folder_is_refused_in_one_line_naming_the_key(profile: str) -> None:
    f = only(findings(profile), "checkpoint.folder")
    assert f.status == FAIL and "\n" not in f.message
    assert f.message.startswith("trainer.default_local_dir is not set: name the checkpoint folder")
    assert "CKPT_DIR" in f.message and f.key == "CKPT_DIR / trainer.default_local_dir"


@pytest.mark.parametrize("value", ["checkpoints/dsv3", "./ckpt", "~/ckpt"])
def test_a_relative_folder_is_refused_on_the_cluster_profiles(value: str) -> None:
    f = only(findings("a3_256die_true_weight", value), "checkpoint.folder")
    assert f.status == FAIL and f"trainer.default_local_dir='{value}' is relative" in f.message
    assert "each node would resolve it in its own working directory" in f.message and "\n" not in f.message
    # the same through an override instead of CKPT_DIR
    f = only(findings("a3_256die_true_weight", None, f"trainer.default_local_dir='{value}'"), "checkpoint.folder")
    assert f.status == FAIL and "is relative" in f.message


def test_the_tiny_profile_keeps_verls_relative_folder() -> None:
    found = findings("tiny", model=roomy_model())
    assert only(found, "checkpoint.folder").status == OK
    assert only(found, "checkpoint.cadence").message == "checkpoints off (trainer.save_freq=-1)"
    assert [f.check for f in found if f.status not in (OK,)] == []


# ---- cost and cadence ----------------------------------------------------------------------------


def test_one_checkpoint_step_of_deepseek_v3_is_computed_from_its_config() -> None:
    step = checkpoint_step(official_config())
    assert step.params == 671_026_404_352  # the 671B model without MTP, from config.json by the memory model
    assert step.nbytes == step.params * 14  # bf16 weights + fp32 master weights + Adam m and v
    assert 9.39 * TB < step.nbytes < 9.40 * TB
    smaller = checkpoint_step({**official_config(), "num_hidden_layers": 5})
    assert smaller.nbytes < step.nbytes / 10  # the smoke profile's model


def test_room_is_the_steps_kept_plus_the_one_being_written() -> None:
    assert room_needed(10, keep=2, existing_steps=0) == 30
    assert room_needed(10, keep=2, existing_steps=2) == 10  # the next save, then the prune
    assert room_needed(10, keep=2, existing_steps=5) == 10
    assert room_needed(10, keep=None, existing_steps=3) == 10  # every step kept: the next one (warned)
    assert room_needed(10, keep=2, existing_steps=0, saves=1) == 10  # a run that saves once
    assert [saves_in_run(10, t) for t in (3, 10, 25, None)] == [1, 1, 3, None]
    assert saves_in_run(-1, 100) == 0


@pytest.mark.parametrize("profile", A3)
def test_the_dry_run_states_the_cadence_and_its_cost(profile: str) -> None:
    f = only(findings(profile, "/shared/ckpt/dsv3"), "checkpoint.cadence")
    assert f.status == OK
    assert "every 10 steps and at the last (trainer.save_freq=10)" in f.message
    assert "one step is 9.39 TB (671.03 B parameters x 14 bytes" in f.message
    assert (
        "2 kept (trainer.max_actor_ckpt_to_keep)" in f.message and "at most 3 on disk at once (28.18 TB)" in f.message
    )
    step_s = {"a3_256die_true_weight": "859.68", "a3_256die_random_init": "796.8"}[profile]
    assert "a failure loses at most 10 steps" in f.message and f"at {step_s} s a step, the vendor's" in f.message


def test_checkpoints_off_on_a_cluster_profile_is_a_warning_naming_save_freq() -> None:
    f = only(findings("a3_256die_true_weight", "/shared/ckpt", "trainer.save_freq=-1"), "checkpoint.cadence")
    assert f.status == WARN and f.key == "trainer.save_freq" and "a failure loses every step" in f.message
    f = only(
        findings("a3_256die_true_weight", "/shared/ckpt", "trainer.max_actor_ckpt_to_keep=null"), "checkpoint.cadence"
    )
    assert f.status == WARN and f.key == "trainer.max_actor_ckpt_to_keep"


# ---- this host's view of the folder --------------------------------------------------------------


def test_a_folder_not_on_this_cpu_host_is_left_to_the_nodes(tmp_path: Path) -> None:
    found = findings("a3_256die_true_weight", str(tmp_path / "absent"))
    assert only(found, "checkpoint.storage").status == NOT_CHECKED
    nodes = only(found, "checkpoint.nodes")
    assert nodes.status == NOT_CHECKED and "checked by the launch on all 16 node(s)" in nodes.message
    assert only(found, "checkpoint.resume").status == NOT_CHECKED


def test_a_folder_missing_on_an_npu_node_is_refused(tmp_path: Path) -> None:
    absent = tmp_path / "absent"
    f = only(findings("a3_256die_true_weight", str(absent), host=NPU), "checkpoint.storage")
    assert f.status == FAIL and f"{absent} does not exist on this node" in f.message
    assert f"mkdir -p -m 700 {absent}" in f.message and not absent.exists()


def folder(tmp_path: Path, mode: int = 0o700) -> Path:
    p = tmp_path / "ckpt"
    p.mkdir()
    p.chmod(mode)
    return p


def test_a_good_folder_passes_with_its_free_space(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(preflight_checkpoint, "filesystem_type", lambda path: "nfs4")
    ck = folder(tmp_path)
    found = findings("a3_256die_true_weight", str(ck), model=roomy_model())
    f = only(found, "checkpoint.storage")
    assert f.status == OK and f"{ck}: writable from this host" in f.message and "filesystem nfs4" in f.message
    assert [p.name for p in ck.iterdir()] == []  # the write probe left nothing


def test_a_folder_on_a_local_filesystem_is_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(preflight_checkpoint, "filesystem_type", lambda path: "xfs")
    f = only(findings("a3_256die_true_weight", str(folder(tmp_path)), model=roomy_model()), "checkpoint.storage")
    assert f.status == WARN and "is on a local filesystem (xfs) of this host" in f.message and f.key == "CKPT_DIR"


@pytest.mark.parametrize("fs", ["tmpfs", "ramfs", "overlay"])
def test_a_folder_in_memory_or_in_the_container_layer_is_refused(tmp_path: Path, monkeypatch, fs: str) -> None:
    monkeypatch.setattr(preflight_checkpoint, "filesystem_type", lambda path: fs)
    f = only(findings("a3_256die_true_weight", str(folder(tmp_path)), model=roomy_model()), "checkpoint.storage")
    assert f.status == FAIL and f"is on {fs}" in f.message and "no other node sees it" in f.message
    assert f.key == "CKPT_DIR" and "\n" not in f.message


def test_too_little_room_is_refused(tmp_path: Path) -> None:
    ck = folder(tmp_path)  # a few GB free here, 28 TB needed for the 671B model
    f = only(findings("a3_256die_true_weight", str(ck)), "checkpoint.storage")
    assert f.status == FAIL and "\n" not in f.message
    assert "free, needs 28.18 TB for 2 kept step(s) (trainer.max_actor_ckpt_to_keep) + 1 being written" in f.message
    assert f.key == "CKPT_DIR / trainer.max_actor_ckpt_to_keep"


def test_a_folder_anyone_can_write_is_refused_as_the_save_refuses_it(tmp_path: Path) -> None:
    ck = folder(tmp_path, 0o777)
    f = only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.storage")
    assert f.status == FAIL and "writable by every user and not sticky" in f.message


@pytest.mark.parametrize("mode", [0o770, 0o775, 0o1777, 0o1770])
def test_a_folder_others_can_write_is_refused_on_the_cluster_as_the_save_refuses_it(
    tmp_path: Path, monkeypatch, mode: int
) -> None:
    """Issue 41 class 4: sticky or not, group or world: the dry run says what the save and the resume say
    (`root_access.root_verdict`, one rule), and the user can accept the risk by name."""
    monkeypatch.setattr(preflight_checkpoint, "filesystem_type", lambda path: "nfs4")
    monkeypatch.delenv(ALLOW_SHARED_ROOT_ENV, raising=False)
    tmp_path.chmod(0o700)
    ck = folder(tmp_path, mode)
    f = only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.storage")
    assert f.status == FAIL and f.message == root_verdict(ck, cluster=True, allow_shared=False).refusal
    assert f"{ALLOW_SHARED_ROOT_ENV}=1" in f.message and ALLOW_SHARED_ROOT_ENV in f.key and "\n" not in f.message
    with pytest.raises(CheckpointRootError) as e:  # the job's own check, in the save and in the resume
        commit.begin_step(ck, 1, cluster=True, environ={})
    assert str(e.value) == f.message
    resume = only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.resume")
    assert resume.status == FAIL and resume.message == f"resume: {f.message}"
    monkeypatch.setenv(ALLOW_SHARED_ROOT_ENV, "1")
    f = only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.storage")
    assert f.status == WARN and f"used because {ALLOW_SHARED_ROOT_ENV}=1" in f.message
    assert only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.resume").status == OK
    monkeypatch.setenv(ALLOW_SHARED_ROOT_ENV, "ture")
    f = only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.storage")
    assert f.status == FAIL and f.message.startswith(f"{ALLOW_SHARED_ROOT_ENV}='ture': expected")


def test_a_level_above_the_folder_others_can_write_is_refused_naming_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(preflight_checkpoint, "filesystem_type", lambda path: "nfs4")
    monkeypatch.delenv(ALLOW_SHARED_ROOT_ENV, raising=False)
    tmp_path.chmod(0o700)
    shared = folder(tmp_path, 0o775)
    ck = shared / "run"
    ck.mkdir(mode=0o700)
    f = only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.storage")
    assert f.status == FAIL and f"({shared}: writable by group/others and not sticky (mode 775)" in f.message


def test_off_the_cluster_a_shared_folder_is_a_warning(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(ALLOW_SHARED_ROOT_ENV, raising=False)
    tmp_path.chmod(0o700)
    ck = folder(tmp_path, 0o770)
    found = findings("tiny", None, f"trainer.default_local_dir={ck}", "trainer.save_freq=5", model=roomy_model())
    f = only(found, "checkpoint.storage")
    assert f.status == WARN and "refused on a cluster profile unless" in f.message


def test_an_unwritable_folder_is_refused(tmp_path: Path, monkeypatch) -> None:
    if os.geteuid() == 0:
        target = Path("/sys/kernel")  # root ignores permission bits; sysfs refuses new files to everyone
        if not target.is_dir():
            pytest.skip("no folder here refuses file creation to root")
        monkeypatch.setattr(preflight_checkpoint, "kept_steps_present", lambda folder: 0)
    else:
        target = folder(tmp_path, 0o500)
    found = findings("a3_256die_true_weight", str(target), model=roomy_model())
    hits = [f for f in found if f.check == "checkpoint.storage" and "cannot create a file there" in f.message]
    assert hits and hits[0].status == FAIL and hits[0].key == "CKPT_DIR"


# ---- the step a resume would take ----------------------------------------------------------------

LAYOUT = TrainLayout(tp=1, pp=1, ep=1, dp=1)


def save_step(root: Path, step: int) -> None:
    staging = commit.begin_step(root, step)
    role = staging / "actor"
    (role / "rng").mkdir(parents=True)
    (role / "rng/rank_00000.pt").write_bytes(b"x" * 8)
    rec = RankRecord(
        rank=0,
        layout=LAYOUT,
        tp_rank=0,
        pp_rank=0,
        ep_rank=0,
        dp_rank=0,
        files={"rng/rank_00000.pt": 8},
        sha256={"rng/rank_00000.pt": hashlib.sha256(b"x" * 8).hexdigest()},
    )
    (role / rank_record_name(0)).parent.mkdir(parents=True, exist_ok=True)
    (role / rank_record_name(0)).write_text(json.dumps(rec.to_json()))
    (staging / "data.pt").write_bytes(b"d")
    final = commit.commit_step(root, staging, step)
    commit.prune(root, 2, protect=(final.name,))


def test_an_empty_folder_resumes_nothing(tmp_path: Path) -> None:
    f = only(findings("a3_256die_true_weight", str(folder(tmp_path)), model=roomy_model()), "checkpoint.resume")
    assert f.status == OK and f.message.startswith("resume: none: starts at step 1")


def test_the_resume_step_is_read_as_the_resume_reads_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(preflight_checkpoint, "filesystem_type", lambda path: "nfs4")
    ck = folder(tmp_path)
    save_step(ck, 10)
    save_step(ck, 20)
    f = only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.resume")
    assert f.status == OK and f.message == f"resume: from {ck / 'global_step_20'} (step 20): continues at step 21"
    # an interrupted newer save is skipped, as the resume skips it, and the line says why
    (ck / "global_step_30").mkdir()
    f = only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.resume")
    assert "(step 20; global_step_30 skipped:" in f.message and f.message.endswith("continues at step 21")
    # the room counts the two steps already kept: one more step is needed, not three
    room = only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.storage")
    assert room.status == OK and "2 already there" in room.message
    disabled = findings("a3_256die_true_weight", str(ck), "trainer.resume_mode=disable", model=roomy_model())
    assert only(disabled, "checkpoint.resume").message.startswith("resume: disabled")


def test_a_named_resume_path_that_is_not_a_checkpoint_fails(tmp_path: Path) -> None:
    ck = folder(tmp_path)
    bad = ck / "global_step_7"
    bad.mkdir()
    found = findings(
        "a3_256die_true_weight",
        str(ck),
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={bad}",
        model=roomy_model(),
    )
    f = only(found, "checkpoint.resume")
    assert f.status == FAIL and f.message.startswith("resume: ") and "global_step_7" in f.message


# ---- validation ----------------------------------------------------------------------------------


def validation(profile: str, *overrides: str) -> Finding:
    cfg, settings = cfg_for(profile, "/shared/ckpt", *overrides)
    (f,) = validation_findings(Context(cfg=cfg, settings=settings, root=ROOT, host=CPU))
    return f


@pytest.mark.parametrize("profile", A3)
def test_validation_is_on_with_its_subset_and_cost(profile: str) -> None:
    f = validation(profile)
    assert f.status == OK
    assert "before training and every 10 steps (and at the last) (trainer.test_freq=10)" in f.message
    assert "1024" in f.message and "overlay.val_max_prompts, a fixed seeded sample" in f.message
    assert "8 per rollout engine of 128, 1 batch(es) of max_num_seqs 64" in f.message
    cost = {"a3_256die_true_weight": ("391 s", "4.5%"), "a3_256die_random_init": ("354 s", "4.4%")}[profile]
    assert f"each costs about {cost[0]}" in f.message and f"{cost[1]} of the 10 steps between validations" in f.message


def test_validation_beyond_one_batch_of_the_engines_is_a_warning() -> None:
    f = validation("a3_256die_true_weight", "overlay.val_max_prompts=10000")
    assert f.status == WARN and "2 batch(es)" in f.message and "lower overlay.val_max_prompts to 8192" in f.message


def test_validation_off_and_a_bad_bound_are_named() -> None:
    off = validation("a3_256die_true_weight", "trainer.test_freq=-1", "trainer.val_before_train=False")
    assert off.status == WARN and off.key == "trainer.test_freq"
    # a bad bound is refused by the composition, as every overlay setting is (base.overlay_settings)
    with pytest.raises(ConfigCompositionError, match=r"^overlay\.val_max_prompts=0: expected an integer >= 1"):
        validation("a3_256die_true_weight", "overlay.val_max_prompts=0")


# ---- the dry run as the user runs it -------------------------------------------------------------


def test_the_dry_run_prints_the_resume_step_and_refuses_a_missing_folder(tmp_path: Path, capsys) -> None:
    ck = folder(tmp_path)
    save_step(ck, 10)
    # too little room here for 28 TB: the dry run fails on the storage, and still prints the resume step
    assert job.main(["--profile", "a3_256die_true_weight", "--dry-run", "--ckpt-dir", str(ck)]) == 1
    out = capsys.readouterr().out
    assert "checkpoint.resume" in out and "continues at step 11" in out
    assert "checkpoint.storage" in out.split("preflight: FAIL")[-1]
    assert job.main(["--profile", "a3_256die_random_init", "--dry-run"]) == 1
    verdict = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("preflight: FAIL") and "checkpoint.folder" in line for line in verdict)


# ---- the profiles as composed -------------------------------------------------------------------


def composed(profile: str, ckpt: str | None = None):
    return cfg_for(profile, ckpt)[0]


@pytest.mark.parametrize("profile", A3)
def test_the_256_die_profiles_checkpoint_and_validate_by_default(profile: str) -> None:
    c = composed(profile, "/shared/ckpt/dsv3").trainer
    assert (c.save_freq, c.max_actor_ckpt_to_keep, c.default_local_dir) == (10, 2, "/shared/ckpt/dsv3")
    assert (c.test_freq, c.val_before_train) == (10, True)
    assert composed(profile, "/shared/ckpt/dsv3").overlay.val_max_prompts == 1024
    assert composed(profile).trainer.default_local_dir is None  # no default: the user names it


def test_the_smoke_profile_checks_both_paths_on_one_batch() -> None:
    c = composed("a3_16die_smoke", "/shared/ckpt/smoke")
    assert (c.trainer.save_freq, c.trainer.test_freq, c.trainer.val_before_train) == (10, 10, True)
    assert c.overlay.val_max_prompts == 256  # 8 rollout engines x max_num_seqs 32
    assert c.actor_rollout_ref.rollout.max_num_seqs * 8 == 256


def test_the_tiny_profile_does_not_change() -> None:
    t = composed("tiny").trainer
    assert (t.save_freq, t.test_freq, t.val_before_train) == (-1, 20, True)
    assert t.default_local_dir == "checkpoints/verl_patches_tiny/tiny_dsv3_grpo_a3_path"  # verl's, as before
    # its 54 test prompts are below the bound: the validation it records in its golden baseline is unchanged
    assert composed("tiny").overlay.val_max_prompts >= 54


def test_the_trainer_entry_refuses_a_missing_folder_before_anything_starts() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH", "CKPT_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    p = fresh_python("-m", "verl_patches.trainer.main_ppo_npu", "profile=a3_256die_true_weight", env=env, timeout=180)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("main_ppo_npu:")]
    assert lines == [f"main_ppo_npu: {folder_problem(composed('a3_256die_true_weight'))}"]
    assert "Traceback" not in p.stderr


# ---- the root's tracker, read by the resume's own reader (issue 42) -------------------------------------------

TRACKER = "latest_checkpointed_iteration.txt"


def damage_tracker(root: Path, kind: str) -> Path:
    tracker = root / TRACKER
    tracker.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(tracker)  # the reader refuses it unread: the dry run never blocks on it
    elif kind == "symlink":
        tracker.symlink_to(root / "elsewhere.txt")
    else:
        tracker.write_bytes({"word": b"abc\n", "empty": b"", "unicode": "²\n".encode(), "huge": b"7" * 60}[kind])
    return tracker


@pytest.mark.parametrize("kind", ["word", "empty", "unicode", "huge", "fifo", "symlink"])
def test_a_damaged_tracker_is_named_when_there_is_nothing_to_resume(tmp_path: Path, kind: str) -> None:
    ck = folder(tmp_path)
    tracker = damage_tracker(ck, kind)
    f = only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.resume")
    assert f.status == WARN and f.key == f"CKPT_DIR ({TRACKER})"
    assert f.message.startswith("resume: none: starts at step 1 (no complete checkpoint under")
    _, problem = commit.read_root_tracker(ck)  # the resume's own reading of it, word for word
    assert problem.startswith(f"{tracker}: ") and problem in f.message
    assert f.message.endswith(f"the resume does not read {TRACKER} as it is: repair it or remove it")


def test_a_damaged_tracker_beside_a_complete_step_is_named_once(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(preflight_checkpoint, "filesystem_type", lambda path: "nfs4")
    ck = folder(tmp_path)
    save_step(ck, 10)
    tracker = damage_tracker(ck, "word")
    f = only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.resume")
    assert f.status == WARN and f.message.startswith(f"resume: from {ck / 'global_step_10'} (step 10; {tracker}: ")
    assert f.message.count(str(tracker)) == 1 and "continues at step 11" in f.message
    tracker.write_text("10\n")  # repaired: nothing to say
    f = only(findings("a3_256die_true_weight", str(ck), model=roomy_model()), "checkpoint.resume")
    assert f.status == OK and f.message == f"resume: from {ck / 'global_step_10'} (step 10): continues at step 11"


def test_the_dry_run_names_a_damaged_tracker(tmp_path: Path) -> None:
    """The command of README section 5 on a folder whose tracker was damaged: one warning naming the file."""
    ck = folder(tmp_path)
    tracker = damage_tracker(ck, "word")
    p = fresh_python(
        "-m",
        "verl_patches.launch.preflight",
        "--profile",
        "a3_256die_true_weight",
        "--json",
        env={**os.environ, "CKPT_DIR": str(ck)},
    )
    report = json.loads(p.stdout)
    (f,) = [f for f in report["findings"] if f["check"] == "checkpoint.resume"]
    assert f["status"] == WARN and str(tracker) in f["message"] and "got 'abc'" in f["message"]
