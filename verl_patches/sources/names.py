"""Allow-lists for values that come from the lock, a cache index, flags or the environment.

These values end up as path components, archive prefixes and git arguments. Each check accepts only
what the lock format needs (so nothing can be read as a git option, a transport that runs commands,
or a path that leaves its folder) and raises ValueError with the offending value; callers add the
file and key.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse

# One path component: letters, digits, '_', '.', '+', '-'; never '.', '..', a leading '-' or '.'.
_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
_HOST = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
_REF_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")
GIT_SCHEMES = ("https", "http", "ssh", "git", "file")
DOWNLOAD_SCHEMES = ("https", "http", "file")
ARTIFACT_SUFFIXES = (".whl", ".zip", ".tar", ".tar.gz", ".tgz")


def plain_name(value: object) -> str:
    """A single path component (a component name, a package folder, an artifact file name)."""
    if not isinstance(value, str) or not _PLAIN.match(value):
        raise ValueError(
            f"{value!r} is not a plain name (letters, digits, '_', '.', '+', '-'; no '/', no leading '.' or '-')"
        )
    return value


# Top-level entries of this repository that a lock's `package` must never name (setup --force would
# replace them with an upstream tree).
RESERVED_PACKAGES = frozenset({"verl_patches", "tests", "bench", "shared"})


def package_folder(value: object) -> str:
    """A package folder at the repo root: an importable top-level name that is not one of ours."""
    name = plain_name(value)
    if not name.isidentifier() or name in RESERVED_PACKAGES:
        raise ValueError(
            f"{value!r} is not an upstream package folder name (a Python identifier other than "
            f"{', '.join(sorted(RESERVED_PACKAGES))})"
        )
    return name


def relative_path(value: object) -> str:
    """A relative posix path inside a folder: plain components separated by '/'."""
    if not isinstance(value, str) or not value.strip("/"):
        raise ValueError(f"{value!r} is not a relative path")
    if value.startswith("/") or "\\" in value:
        raise ValueError(f"{value!r} must be relative, with '/' separators")
    for part in value.rstrip("/").split("/"):
        try:
            plain_name(part)
        except ValueError:
            raise ValueError(
                f"{value!r}: component {part!r} is not allowed (no '', '.', '..', leading '-' or '.')"
            ) from None
    return value


def artifact_file(value: object) -> str:
    name = plain_name(value)
    if not name.endswith(ARTIFACT_SUFFIXES):
        raise ValueError(f"{value!r} is not a wheel, zip or tar file name")
    return name


def git_ref(value: object) -> str:
    """A full ref name under refs/tags/ or refs/heads/ (no option, no revision syntax)."""
    if not isinstance(value, str) or not value.startswith(("refs/tags/", "refs/heads/")):
        raise ValueError(f"{value!r} is not a full ref (refs/tags/NAME or refs/heads/NAME)")
    parts = value.split("/")[2:]
    if (
        not parts
        or not all(_REF_PART.match(p) and not p.endswith((".lock", ".")) for p in parts)
        or ".." in value
        or "@{" in value
    ):
        raise ValueError(f"{value!r} is not a valid ref name")
    return value


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(_HOST.match(host))


def git_url(value: object) -> str:
    """A git remote that git cannot read as an option or as a command-running transport.

    Allowed: https/http/ssh/git/file URLs, scp-like `user@host:path`, and absolute local paths (mirrors
    on air-gapped clusters). Refused: anything starting with '-', `ext::`/`fd::` and other
    transports, hosts starting with '-', control characters and whitespace in host parts.
    """
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a git URL")
    if value.startswith("-"):
        raise ValueError(f"{value!r} starts with '-' (git would read it as an option)")
    if "\x00" in value or "\n" in value or "\r" in value:
        raise ValueError(f"{value!r} contains a control character")
    if value.startswith("/"):
        return value
    if "://" in value:
        parsed = urllib.parse.urlsplit(value)
        scheme = parsed.scheme.lower()
        if scheme not in GIT_SCHEMES:
            raise ValueError(
                f"{value!r}: scheme {scheme!r} is not allowed (allowed: {', '.join(GIT_SCHEMES)}, "
                f"user@host:path, or an absolute path)"
            )
        if scheme == "file":
            if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
                raise ValueError(f"{value!r}: a file URL must be file:///absolute/path")
            return value
        host = parsed.hostname or ""
        user = parsed.username
        if not _valid_host(host) or _CONTROL.search(parsed.netloc):
            raise ValueError(f"{value!r}: host {host!r} is not a host name or address")
        if user is not None and not _USER.match(urllib.parse.unquote(user)):
            raise ValueError(f"{value!r}: user name {user!r} is not allowed")
        return value
    if "::" in value.split("/", 1)[0]:
        raise ValueError(f"{value!r}: transport {value.split('::', 1)[0]!r}:: is not allowed")
    m = re.match(r"^(?:([^@/:]+)@)?([^@/:]+):(.+)$", value)
    if m:  # scp-like syntax: git runs ssh with this host
        user, host, path = m.groups()
        if (user is not None and not _USER.match(user)) or not _valid_host(host):
            raise ValueError(f"{value!r}: user or host is not allowed")
        if path.startswith("-"):
            raise ValueError(f"{value!r}: the path starts with '-'")
        return value
    raise ValueError(
        f"{value!r} is not an allowed git URL (https/http/ssh/git/file URL, user@host:path, or an absolute path)"
    )


def download_url(value: object) -> str:
    if (
        not isinstance(value, str)
        or urllib.parse.urlsplit(value).scheme.lower() not in DOWNLOAD_SCHEMES
        or _CONTROL.search(value)
    ):
        raise ValueError(f"{value!r} is not an https, http or file URL")
    return value
