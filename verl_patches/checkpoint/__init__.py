"""Checkpoint, resume and export of a training run on the A3 path (issue #16).

A checkpoint of step N is one folder ``<trainer.default_local_dir>/global_step_N`` that appears by a
single rename once everything in it is written and checked, so a crash while saving leaves the previous
checkpoint as the latest valid one:

    .verl_patches_run_secret     the run's secret (0600, this account's): signs every manifest (issue 41)
    global_step_N/
      checkpoint.json            the step manifest (written last, before the rename): step, layout, each
                                 file's size and sha256, and its signature with the run's secret
      .verl_patches_owner        a tag derived from the secret (0600): the folder was created by this root's
                                 saves, so pruning may delete it
      data.pt                    the train dataloader's position (verl's StatefulDataLoader state)
      actor/
        latest_checkpointed_iteration.txt, hf_to_mcore_manifest.json   (our converter's layout: the export
        iter_000000N/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt           tool and C1's loader read it as is)
        optim/mp_rank_..._params.pt   the distributed optimizer's parameter state (Adam moments, fp32 params)
        optim/rank_RRRRR_common.pt    the optimizer's param groups (step count, lr) and grad scaler
        rng/rank_RRRRR.pt             python, numpy, torch, device and Megatron tracker RNG states
        ranks/rank_RRRRR.json         what rank R wrote (its coordinates, file sizes and sha256s)

A resume reads only files the step manifest lists, by names confined to the step folder, each checked
against its sha256 before it is read and loaded with ``weights_only=True`` (issue #27), and only from a
manifest whose signature verifies with the secret of the root holding it: a step copied in by another
account, or resealed after an edit, is refused by name (issue 41).

Modules: `plan` (pure: names, which checkpoint to resume from, what to prune), `manifest` (pure: rank records
-> step manifest, strict parsers, layout comparison and its error), `commit` (the rename, ownership, tracker
and pruning), `run_identity` (the run's secret and what it signs), `root_access` (who may change a checkpoint
root: the save's, the resume's, the dry run's and every node's one rule), `tracker` (the one strict tracker /
step-number parser), `confine` (names and paths kept inside their folder), `strict_json`, `safe_load` (the one
``.pt`` reader), `optimizer_state` (the distributed optimizer's parameter state without Megatron's bare
``torch.load``), `rng`, `committed_role` (a committed role folder read back, file by listed file) and
`trainer_io` (the driver's save and resume, used by the declared patches in
verl_patches/patches/verl/utils/checkpoint). The Megatron actor's per-rank save/load writes its shards in the
weights tools' layout, so it lives a layer above both, in `verl_patches.train_engine.actor_state`.
"""
