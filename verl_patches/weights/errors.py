"""Named errors of the weight tools; each message names the file, key, tensor or rank at fault."""


class WeightsError(Exception):
    """Base class: the CLIs print ``str(err)`` as one line and exit non-zero."""


class ConfigError(WeightsError):
    """A config.json is missing a key, has a wrong type or an inconsistent value."""


class CheckpointError(WeightsError):
    """A checkpoint on disk is malformed: bad index, missing shard, unreadable file."""


class MissingTensorError(CheckpointError):
    """A tensor the conversion needs is absent from the source checkpoint."""


class LayoutError(WeightsError):
    """Parallel-layout flags are inconsistent with each other or with the model config."""


class ResumeError(WeightsError):
    """An output directory holds a different, incompatible conversion."""


class VerifyError(WeightsError):
    """A converted tensor differs from its source."""


class ManifestError(CheckpointError):
    """A manifest our tools wrote is unreadable or malformed (names the file and the key)."""
