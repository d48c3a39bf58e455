"""Convert the DeepScaleR data set (JSON array or JSON Lines) to verl RL parquet files.

Run from the repo root:
    python verl_patches/scripts/json_to_parquet.py --json_path deepscaler.json --output_dir data/deepscaler
Writes train.parquet and test.parquet (data_source "deepscaler"); the logic is in verl_patches.data.
Exit status, as the weight tools: 0 written; 2 bad usage or input (nothing written); 1 the output could not be
written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MAX_ERRORS_SHOWN = 50
EXIT_BAD_INPUT = 2  # bad usage or input, as argparse and the weight tools (verl_patches.weights.cli)
EXIT_WRITE_FAILED = 1


def build_parser() -> argparse.ArgumentParser:
    # deferred: run as a file, this script has the package only once the __main__ block put the repo on sys.path
    from verl_patches.base.finite_float import float_arg
    from verl_patches.base.strict_int import int_arg
    from verl_patches.data.convert import DEFAULT_SEED, DEFAULT_TRAIN_RATIO
    from verl_patches.data.templates import DEFAULT_TEMPLATE, TEMPLATES
    from verl_patches.data.validation import DEFAULT_MAX_FIELD_CHARS, MAX_FIELD_FLAG

    parser = argparse.ArgumentParser(
        description="deepscaler JSON/JSONL -> verl RL parquet (train.parquet, test.parquet).",
    )
    parser.add_argument(
        "--json_path", required=True, help="input: a JSON array of {problem, answer, solution} objects, or JSON Lines"
    )
    parser.add_argument(
        "--output_dir", required=True, help="directory for train.parquet and test.parquet (created if missing)"
    )
    parser.add_argument(
        "--train_data_ratio",
        type=float_arg(above=0, below=1),
        default=DEFAULT_TRAIN_RATIO,
        help=f"share of rows for train, in (0, 1) (default {DEFAULT_TRAIN_RATIO})",
    )
    parser.add_argument(
        "--seed", type=int_arg(0), default=DEFAULT_SEED, help=f"seed of the shuffled split (default {DEFAULT_SEED})"
    )
    parser.add_argument(
        "--template",
        default=DEFAULT_TEMPLATE,
        help=f"prompt template: one of {sorted(TEMPLATES)} ('none' keeps the bare problem) "
        f"or a text containing {{problem}} (default {DEFAULT_TEMPLATE})",
    )
    parser.add_argument(
        MAX_FIELD_FLAG,
        type=int_arg(1),
        default=DEFAULT_MAX_FIELD_CHARS,
        metavar="N",
        help=f"a row whose problem, answer or solution is longer than N characters is invalid "
        f"(default {DEFAULT_MAX_FIELD_CHARS})",
    )
    parser.add_argument(
        "--skip-invalid",
        "--skip_invalid",
        dest="skip_invalid",
        action="store_true",
        help="convert the valid rows and report the invalid ones (default: write nothing if any row is invalid)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing train.parquet/test.parquet in --output_dir (default: refuse)",
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    # deferred: run as a file, this script has the package only once the __main__ block put the repo on sys.path
    from verl_patches.data.convert import convert
    from verl_patches.data.errors import DeepscalerInputError, InvalidRowsError
    from verl_patches.data.templates import TemplateError

    args = build_parser().parse_args(argv)
    try:
        report = convert(
            args.json_path,
            args.output_dir,
            train_ratio=args.train_data_ratio,
            seed=args.seed,
            template=args.template,
            skip_invalid=args.skip_invalid,
            progress=args.progress,
            overwrite=args.overwrite,
            max_field_chars=args.max_field_chars,
        )
    except InvalidRowsError as exc:
        for error in exc.errors[:MAX_ERRORS_SHOWN]:
            print(f"error: {error}", file=sys.stderr)
        if len(exc.errors) > MAX_ERRORS_SHOWN:
            print(f"error: ... and {len(exc.errors) - MAX_ERRORS_SHOWN} more invalid rows", file=sys.stderr)
        print(
            f"error: {len(exc.errors)} of {exc.rows_in} rows are invalid; "
            "nothing written (use --skip-invalid to convert the valid rows)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    except (DeepscalerInputError, TemplateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"error: cannot write {args.output_dir}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    for error in report.rejected[:MAX_ERRORS_SHOWN]:
        print(f"rejected: {error}", file=sys.stderr)
    if len(report.rejected) > MAX_ERRORS_SHOWN:
        print(f"rejected: ... and {len(report.rejected) - MAX_ERRORS_SHOWN} more", file=sys.stderr)
    print(report.summary())
    return 0


if __name__ == "__main__":
    # Run as a file (python verl_patches/scripts/json_to_parquet.py): make the package importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from verl_patches.base.tool_python import third_party_imports

    with third_party_imports("json_to_parquet.py"):  # another Python than requirements.txt's: one line, exit 2
        status = main()
    sys.exit(status)
