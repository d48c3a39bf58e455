#!/usr/bin/env python3
"""Write the DeepSeek-V3 training config.json (no quantization_config, no MTP), or its tiny variant.

python verl_patches/scripts/make_config.py --out ./DeepSeek-V3                      # built-in 671B values
python verl_patches/scripts/make_config.py --from /data/DeepSeek-V3 --out ./DeepSeek-V3  # + tokenizer files
python verl_patches/scripts/make_config.py --tiny --vocab-size 512 --out ./tiny-dsv3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: make the repo importable

from verl_patches.base.tool_python import third_party_imports  # noqa: E402

with third_party_imports("make_config.py"):  # another Python than requirements.txt's: one line, exit 2
    from verl_patches.base.strict_int import int_arg
    from verl_patches.weights.cli import run_cli
    from verl_patches.weights.config import (
        make_tiny_config,
        make_training_config,
        read_config_json,
        resolve_config_path,
    )
    from verl_patches.weights.errors import ConfigError
    from verl_patches.weights.hf_dir import write_model_dir


def parse_set(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
        except (ValueError, RecursionError):  # a number beyond Python's digit limit, or nesting beyond the stack
            raise ConfigError(
                f"--set {key}: the value is not a config value (a number or a nesting beyond any config)"
            ) from None
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--from",
        dest="source",
        metavar="DIR_OR_FILE",
        help="start from this config.json (or model directory): quantisation and MTP are removed, "
        "every other key kept; tokenizer and remote-code files of a directory are copied",
    )
    src.add_argument("--tiny", action="store_true", help="the tiny variant (same keys, small sizes)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (config.json is written there)")
    p.add_argument(
        "--vocab-size", type=int_arg(1), default=512, help="vocabulary size of the tiny variant (default 512)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key (VALUE parsed as JSON, else a string); repeatable",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        overrides = parse_set(args.set)
        carry = None
        if args.tiny:
            cfg = make_tiny_config(args.vocab_size, **overrides)
        else:
            source = None
            where = "built-in"
            if args.source:
                source = read_config_json(args.source)
                where = str(resolve_config_path(args.source))
                if Path(args.source).is_dir():
                    carry = Path(args.source)
            base = dict(source) if source is not None else None
            if overrides:
                base = dict(base if base is not None else make_training_config())
                base.update(overrides)
            cfg = make_training_config(base, where=where)
        out = Path(args.out)
        if carry is not None and carry.resolve() == out.resolve():
            carry = None  # rewriting a model directory's own config in place
        for note in write_model_dir(cfg, out, carry):
            print(note, file=sys.stderr)
        print(
            f"wrote {out / 'config.json'} ({cfg['num_hidden_layers']} layers, {cfg['n_routed_experts']} experts, "
            f"hidden {cfg['hidden_size']}, vocab {cfg['vocab_size']})"
        )
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
