"""The job's entry and its config: `main_ppo_npu` (the trainer entry), `cluster_check` (the entry's way into a
running cluster, without training), the config composed over verl's own (`config_compose`, `config/`), the runs
known by name (`profiles`) and what the entry checks and saves before step 1 (`checkpoint_folder`,
`resolved_config`)."""
