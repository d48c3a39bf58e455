"""Errors of the source routes. Each message names the component, the route and what was found."""


class SourceError(RuntimeError):
    """Base class."""


class RouteUnavailable(SourceError):
    """This route cannot produce the component here (no network, no artifact, not offered)."""


class IntegrityError(SourceError):
    """The route produced something other than what the lock pins (moved tag, wrong sha256 or tree)."""


class LocalEditsError(SourceError):
    """A vendored folder differs from what setup installed; it is not overwritten without --force."""
