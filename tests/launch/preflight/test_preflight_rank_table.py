"""The per-rank layout printed by `--dry-run` (issue 15 item 6): every training rank's TP/CP/EP/DP/PP
coordinates in tp-cp-ep-dp-pp order and its layers from the uneven layer list; every rollout rank's TP
rank, DP rank, vLLM instance and experts. Checked exhaustively against closed forms (and megatron.core's
RankGenerator where it imports), printed compactly for 256 ranks, and shown by the preflight (text and
JSON) for the 256-die profiles and the 16-die smoke profile, which passes."""

from __future__ import annotations

import itertools
import json
import warnings

import pytest

from verl_patches.launch.preflight.findings import HostFacts
from verl_patches.launch.preflight.rank_table import (
    render_rank_tables,
    render_rollout,
    rollout_rank_table,
    stage_layers,
    training_rank_table,
)
from verl_patches.launch.preflight.report import main
from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.layout import (
    MegatronLayout,
    RolloutLayout,
    production_rollout_layout,
    production_training_layout,
)

CPU = HostFacts(device="cpu")
PROD_LIST = [7, 7, 8, 8, 8, 8, 8, 7]


@pytest.fixture(autouse=True)
def _no_path_env(monkeypatch):
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH", "NNODES", "NPUS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CKPT_DIR", "/shared/ckpt/dsv3")  # the A3 profiles' checkpoint folder has no default


def training_layouts():
    for world in (1, 2, 4, 8, 12, 16, 24, 32, 64):
        for tp, pp, cp, ep in itertools.product((1, 2, 4), (1, 2, 4), (1, 2), (1, 2, 4)):
            try:
                yield MegatronLayout(world_size=world, tp=tp, pp=pp, ep=ep, cp=cp)
            except InvalidLayoutError:
                continue


def test_training_coordinates_follow_the_tp_cp_ep_dp_pp_order_exhaustively() -> None:
    checked = 0
    for lay in training_layouts():
        layers = 3 * lay.pp + 1
        lst = [3] * (lay.pp - 1) + [4]
        rows = training_rank_table(lay, layers, lst)
        assert [r.rank for r in rows] == list(range(lay.world_size))
        seen = set()
        for r in rows:
            # tp fastest, then cp, then the full data-parallel rank (ep is its fastest part), then pp
            assert r.rank == r.tp + lay.tp * (r.cp + lay.cp * (r.dp + lay.dp * r.pp)), (lay, r)
            assert r.ep == r.dp % lay.ep
            assert r.layers == range(3 * r.pp, 3 * r.pp + lst[r.pp])
            seen.add((r.tp, r.cp, r.dp, r.pp))
        assert len(seen) == lay.world_size
        assert sorted(itertools.chain.from_iterable(stage_layers(layers, lay.pp, lst))) == list(range(layers))
        checked += 1
    assert checked > 200


def test_training_groups_agree_with_megatron_rank_generator() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ps = pytest.importorskip("megatron.core.parallel_state", reason="vendored megatron.core needed")
    for lay in training_layouts():
        rows = training_rank_table(lay, lay.pp, None)
        gen = ps.RankGenerator(tp=lay.tp, ep=lay.ep, dp=lay.dp, pp=lay.pp, cp=lay.cp, order=lay.order)
        for token, fields in (("tp", ("cp", "dp", "pp")), ("pp", ("tp", "cp", "dp")), ("dp", ("tp", "cp", "pp"))):
            for group in gen.get_ranks(token, False):
                keys = {tuple(getattr(rows[g], f) for f in fields) for g in group}
                assert len(keys) == 1, (lay, token, group)
        for group in gen.get_ranks("ep", True):
            assert sorted(rows[g].ep for g in group) == list(range(lay.ep)), (lay, group)


def test_production_layer_offsets() -> None:
    rows = training_rank_table(production_training_layout(), 61, PROD_LIST)
    starts = sorted({r.layers.start for r in rows})
    assert starts == [0, 7, 14, 22, 30, 38, 46, 54]
    assert rows[255].layers == range(54, 61) and rows[0].layers == range(0, 7)


@pytest.mark.parametrize("bad", [[7, 7], [7, 7, 8, 8, 8, 8, 8, 8], [0, 14, 8, 8, 8, 8, 8, 7]])
def test_bad_layer_lists_are_refused(bad) -> None:
    with pytest.raises(InvalidLayoutError):
        stage_layers(61, 8, bad)
    with pytest.raises(InvalidLayoutError):
        stage_layers(61, 8, None)


def test_rollout_rows_exhaustively() -> None:
    checked = 0
    for world, tp, dp in itertools.product((1, 2, 4, 8, 16, 32), (1, 2, 4), (1, 2, 4, 8)):
        try:
            lay = RolloutLayout(world_size=world, tp=tp, dp_per_instance=dp)
        except InvalidLayoutError:
            continue
        for experts in (lay.ep_size, lay.ep_size * 3, lay.ep_size * 2 + 1):
            rows = rollout_rank_table(lay, experts)
            for r in rows:
                assert r.rank == r.instance * lay.instance_size + r.dp * tp + r.tp
                assert r.ep == r.dp * tp + r.tp and 0 <= r.tp < tp and 0 <= r.dp < dp
            for inst in range(lay.num_instances):
                owned = [e for r in rows if r.instance == inst for e in r.experts]
                assert owned == list(range(experts))  # each expert served once per instance, in rank order
            checked += 1
    assert checked > 50


def test_256_die_print_is_compact_and_complete() -> None:
    t = production_training_layout()
    r = production_rollout_layout(64)
    text = render_rank_tables((training_rank_table(t, 61, PROD_LIST), t), (rollout_rank_table(r, 256), r, 256))
    lines = text.splitlines()
    assert len(lines) < 50 and max(len(x) for x in lines) <= 122
    for stage, layers in enumerate(["0-6", "7-13", "14-21", "22-29", "30-37", "38-45", "46-53", "54-60"]):
        assert f"pp{stage} layers {layers} " in text
    assert "dp7 ep7: 252-255" in text  # last TP group of the last stage
    assert "instance 1: ranks 128-255" in text and "r255(ep127): 254-255" in text
    assert "(59 more, same step)" in text


def test_irregular_lists_are_not_elided() -> None:
    lay = RolloutLayout(world_size=16, tp=2, dp_per_instance=8)
    rows = rollout_rank_table(lay, 16 * 2 + 1)  # the last rank takes the remainder: not one step
    text = "\n".join(render_rollout(rows, lay, 33, max_entries=4))
    assert "more, same step" in text.split("experts by rank")[0]  # engines are regular
    assert "more, same step" not in text.split("experts by rank")[1]
    assert "r15(ep15): 30-32" in text and "r9(ep9): 18-19" in text


@pytest.mark.parametrize("profile", ["a3_256die_true_weight", "a3_256die_random_init"])
def test_dry_run_prints_the_layout_and_passes(profile, capsys) -> None:
    assert main(["--profile", profile], host=CPU) == 0
    out = capsys.readouterr().out
    assert "preflight: PASS" in out and "per-rank layout" in out
    assert "training ranks: TP4 CP1 EP8 DP8 PP8 over 256" in out
    instances = {"a3_256die_true_weight": 2, "a3_256die_random_init": 1}[profile]
    assert f"{instances} instance(s)" in out


def test_json_carries_every_rank() -> None:
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["--profile", "a3_256die_random_init", "--json"], host=CPU) == 0
    lay = json.loads(buf.getvalue())["rank_layout"]
    assert len(lay["training"]) == 256 and len(lay["rollout"]) == 256 and lay["problems"] == []
    assert lay["training"][255] == {"rank": 255, "tp": 3, "cp": 0, "ep": 7, "dp": 7, "pp": 7, "layers": [54, 61]}
    assert lay["rollout"][255] == {"rank": 255, "tp": 1, "dp": 127, "instance": 0, "ep": 255, "experts": [255, 256]}


def smoke_model_dir(tmp_path, layers: int):
    """What make_config.py --set num_hidden_layers=N writes (tokenizer files are only looked for)."""
    from verl_patches.weights.config import config_to_json, official_config

    d = tmp_path / f"DeepSeek-V3-{layers}"
    d.mkdir()
    cfg = official_config()
    cfg["num_hidden_layers"] = layers
    (d / "config.json").write_text(config_to_json(cfg))
    (d / "tokenizer.json").write_text("{}")
    (d / "tokenizer_config.json").write_text("{}")
    return d


def test_smoke_profile_passes_preflight_on_one_node(tmp_path, capsys) -> None:
    model = smoke_model_dir(tmp_path, 5)
    assert main(["--profile", "a3_16die_smoke", "--nnodes", "1", "--model-path", str(model), "--json"], host=CPU) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["summary"]["passed"] and report["summary"]["counts"]["fail"] == 0
    assert any("(5 layers, 256 experts)" in f["message"] for f in report["findings"] if f["check"] == "model.config")
    assert main(["--profile", "a3_16die_smoke", "--nnodes", "1", "--model-path", str(model)], host=CPU) == 0
    out = capsys.readouterr().out
    assert "preflight: PASS" in out
    assert "training ranks: TP2 CP1 EP4 DP4 PP2 over 16" in out and "pp1 layers 4 (1)" in out
    assert "1 instance(s), EP16" in out
    # the full 61-layer model, or the default 16 nodes, are refused naming what to change
    full = smoke_model_dir(tmp_path, 61)
    assert main(["--profile", "a3_16die_smoke", "--nnodes", "1", "--model-path", str(full)], host=CPU) == 1
    assert "pipeline_parallel_num_layer_list" in capsys.readouterr().out
    assert main(["--profile", "a3_16die_smoke", "--model-path", str(model)], host=CPU) == 1
    assert "NNODES" in capsys.readouterr().out


def test_smoke_profile_keeps_the_cluster_jobs_features() -> None:
    from verl_patches.driver.config_checks import check_config, get
    from verl_patches.launch.preflight.report import compose
    from verl_patches.launch.settings import load_settings
    from verl_patches.trainer.config_compose import REPO_ROOT
    from verl_patches.trainer.profiles import PROFILES

    p = PROFILES["a3_16die_smoke"]
    cfg = compose(p.config_name, [*p.overrides], load_settings({}, None, environ={}), REPO_ROOT)
    m = "actor_rollout_ref.actor.megatron"
    for key, want in (
        (f"{m}.sequence_parallel", True),
        (f"{m}.swap_optimizer", True),
        ("actor_rollout_ref.actor.recompute_old_log_prob", False),
        ("overlay.fused_actor_rollout_ref", True),
        ("actor_rollout_ref.rollout.name", "vllm"),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", True),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", 2),
        ("overlay.vllm_dp_size", 8),
        ("trainer.nnodes", 1),
        ("trainer.n_gpus_per_node", 16),
        ("actor_rollout_ref.actor.load_weight", False),
    ):
        assert get(cfg, key) == want, key
    assert list(get(cfg, f"{m}.pipeline_parallel_num_layer_list")) == [4, 1]
    assert check_config(cfg, environ={"D2D_DATA_TRANSFER": "1"}) == []
