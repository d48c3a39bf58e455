"""Checkpoint, resume and export of a training run on the A3 path (issue #16).

A checkpoint of step N is one folder ``<trainer.default_local_dir>/global_step_N`` that appears by a
single rename once everything in it is written and checked, so a crash while saving leaves the previous
checkpoint as the latest valid one:

    global_step_N/
      checkpoint.json            the step manifest (written last, before the rename): step, layout, files
      data.pt                    the train dataloader's position (verl's StatefulDataLoader state)
      actor/
        latest_checkpointed_iteration.txt, hf_to_mcore_manifest.json   (our converter's layout: the export
        iter_000000N/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt           tool and C1's loader read it as is)
        optim/mp_rank_..._params.pt   the distributed optimizer's parameter state (Adam moments, fp32 params)
        optim/rank_RRRRR_common.pt    the optimizer's param groups (step count, lr) and grad scaler
        rng/rank_RRRRR.pt             python, numpy, torch, device and Megatron tracker RNG states
        ranks/rank_RRRRR.json         what rank R wrote (its coordinates and file sizes)

Modules: `plan` (pure: names, which checkpoint to resume from, what to prune), `manifest` (pure: rank
records -> step manifest, layout comparison and its error), `commit` (the rename, tracker and pruning),
`rng`, `actor_state` (per-rank save/load of the Megatron actor) and `trainer_io` (the driver's save and
resume, used by the declared patches in verl_patches/patches/verl/utils/checkpoint).
"""
