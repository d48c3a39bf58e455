"""Settings read from the environment: one grammar for switches, and typed getters for numbers and lists.

A boolean switch (``PRINT_MEMORY``, ``D2D_DATA_TRANSFER``, a patch's ``env_flag``...) has one grammar and
one meaning everywhere, case and surrounding spaces ignored:

* on: ``1``, ``true``, ``yes``, ``on``;
* off: ``0``, ``false``, ``no``, ``off``, and the empty string;
* unset: the caller's default (off unless said otherwise);
* anything else (``enabled``, ``2``, ``ture``) is an `EnvError` naming the variable, the value and the
  accepted spellings: a typo never silently means "on" in one place and "off" in another.

Numbers are strict (`verl_patches.base.strict_int` for integers; floats finite), unset or empty means the
default, and every refusal is one line ``NAME='value': what was expected``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from verl_patches.base.strict_int import IntError, parse_int

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off", "")
SPELLINGS = f"{', '.join(ON)} (on) or {', '.join(s for s in OFF if s)}, empty (off)"


class EnvError(ValueError):
    """An environment variable whose value is not one this setting accepts; one line naming both."""


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def parse_flag(name: str, raw: str) -> bool:
    """``raw`` (the value of ``name``) read as a switch; `EnvError` for a spelling not in the grammar."""
    word = raw.strip().lower()
    if word in ON:
        return True
    if word in OFF:
        return False
    raise EnvError(f"{name}={raw!r}: expected {SPELLINGS}")


def env_flag(name: str, *, default: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """The switch ``name`` of ``environ`` (default: this process's environment); ``default`` when unset."""
    raw = _env(environ).get(name)
    return default if raw is None else parse_flag(name, raw)


def env_str(name: str, default: str = "", *, environ: Mapping[str, str] | None = None) -> str:
    """The value of ``name`` without surrounding spaces; ``default`` when unset or empty."""
    raw = _env(environ).get(name, "").strip()
    return raw or default


def env_int(
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """The integer ``name`` (an optional '-' and ASCII digits, surrounding spaces ignored), within
    [minimum, maximum] when given; ``default`` when unset or empty."""
    raw = _env(environ).get(name, "")
    if not raw.strip():
        return default
    try:
        value = parse_int(raw.strip(), "value")
    except IntError:
        raise EnvError(f"{name}={raw!r}: expected an integer (an optional '-' and 1 to 12 ASCII digits)") from None
    try:
        return parse_int(value, "value", minimum, maximum)
    except IntError as err:  # out of range: the message says which bound
        raise EnvError(f"{name}={raw!r}: {str(err).removeprefix('value: ')}") from None


def env_float(
    name: str,
    default: float,
    *,
    minimum: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> float:
    """The finite number ``name`` (at least ``minimum`` when given); ``default`` when unset or empty."""
    raw = _env(environ).get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise EnvError(f"{name}={raw!r}: expected a number") from None
    if not math.isfinite(value):
        raise EnvError(f"{name}={raw!r}: expected a finite number")
    if minimum is not None and value < minimum:
        raise EnvError(f"{name}={raw!r}: must be at least {minimum}")
    return value


def env_list(name: str, *, sep: str = ",", environ: Mapping[str, str] | None = None) -> list[str]:
    """The ``sep``-separated items of ``name``, each without surrounding spaces, empty items dropped."""
    return [item.strip() for item in _env(environ).get(name, "").split(sep) if item.strip()]
