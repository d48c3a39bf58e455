"""deepscaler JSON/JSONL -> verl v0.4.0 RL parquet (vendor item I).

- `errors`: the error types, each naming the file, line, row and key at fault.
- `reader`: JSON array / JSON Lines records with their line numbers.
- `validation`: one record -> a `DeepscalerExample` or a `RowError`.
- `templates`: the prompt templates (default: reason in `<think> </think>`, answer in `\\boxed{}`).
- `split`: the seeded shuffled train/test plan that keeps duplicate problems on one side.
- `rl_rows`: the verl row schema.
- `parquet_io`: writing parquet files atomically.
- `convert`: `convert(json_path, output_dir, ...) -> ConversionReport`, the public API.

Importing this package has no side effects.
"""
