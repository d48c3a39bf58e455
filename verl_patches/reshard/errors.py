"""Named errors of the reshard package.

Every error names the condition that was violated, so a layout mistake is caught by the preflight
(or the first reshard) with a message that says which number is wrong, not by a hang inside a collective.
"""

from __future__ import annotations


class ReshardError(Exception):
    """Base class of every error raised by `verl_patches.reshard`."""


class InvalidLayoutError(ReshardError, ValueError):
    """A training or rollout layout, or a pair of them, cannot be resharded.

    `condition` is a short machine-readable name of the violated condition (for tests and the preflight);
    the message spells it out with the offending numbers.
    """

    def __init__(self, condition: str, message: str) -> None:
        super().__init__(f"{condition}: {message}")
        self.condition = condition


class PlanMismatchError(ReshardError, ValueError):
    """Local tensors handed to an executor do not match the plan (shape, dtype, group membership)."""


class TensorCacheError(ReshardError):
    """Base class of the tensor-cache errors."""


class TensorCacheKeyExistsError(TensorCacheError, KeyError):
    """`put` on a key that is already cached without `overwrite=True`."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key

    def __str__(self) -> str:
        return (
            f"tensor cache already holds {self.key!r}; pass overwrite=True to replace it "
            f"or clear() the cache at the end of the step"
        )


class TensorCacheMissingKeyError(TensorCacheError, KeyError):
    """`get` of a key that is not cached."""

    def __init__(self, key: str, cached: list[str]) -> None:
        super().__init__(key)
        self.key = key
        self.cached = cached

    def __str__(self) -> str:
        return f"tensor cache has no {self.key!r} (cached keys: {self.cached})"


class TensorCachePreconditionError(TensorCacheError, ValueError):
    """The verl config is incompatible with keeping rollout tensors on the workers.

    `violations` maps each offending config key to the reason; the message lists all of them.
    """

    def __init__(self, violations: dict[str, str]) -> None:
        self.violations = dict(violations)
        lines = "; ".join(f"{key}: {why}" for key, why in self.violations.items())
        super().__init__(f"D2D tensor cache cannot be enabled with this config: {lines}")
