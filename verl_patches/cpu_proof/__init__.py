"""The CPU proof: the tiny run on the A3 path on one CPU machine, and the check that it learned.

  tiny_a3        which assets the tiny run needs, derived from the composed config, and building them
  tiny_assets    data, tokenizer and model built on this machine (nothing is downloaded)
  tiny_base      an option of the assets: a base model trained a few supervised steps first
  golden         the golden-metrics check of a finished run against a stored baseline
  golden_record  re-record that baseline from several runs of README command 1

No production unit imports this package (tests/ci/test_layers.py holds that); the run's metrics are read by the
driver's `run_metrics`. Importing this package has no side effects.
"""
