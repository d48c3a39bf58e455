"""What a patch is: a declared, fingerprinted replacement of one upstream object, with its reason."""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from verl_patches.base import env_registry

DEVICES = ("npu", "cuda", "cpu")
ALL_DEVICES = DEVICES
CPU_ONLY = ("cpu",)  # the CPU proof's ports of upstream to a host without an accelerator
ABSENT = "absent"  # fingerprint of a target that must not exist upstream (we add it)


class Kind(str, enum.Enum):
    REPLACE = "replace"  # target attribute := replacement()
    WRAP = "wrap"  # target attribute := replacement(original)
    REGISTRY = "registry"  # target mapping[key...] := replacement()
    MODULE_ALIAS = "module-alias"  # sys.modules[target] := the module named by `provides`, if the real one is absent


class PatchError(RuntimeError):
    """Base class of patch failures."""


class PatchDriftError(PatchError):
    """The upstream object a patch replaces is not the one it was written against."""

    def __init__(self, patch: Patch, found: str, pin: str, relied_on: str = "", declared: str = "") -> None:
        """`relied_on`: the upstream object (one of `patch.relies_on`) that drifted, with its `declared`
        fingerprint; empty when the patch's own target drifted."""
        self.patch, self.found, self.pin, self.relied_on = patch, found, pin, relied_on
        what = f"relies on {relied_on}" if relied_on else f"targets {patch.target}"
        pinned = f"the fingerprint of {relied_on}" if relied_on else "its fingerprint"
        super().__init__(
            f"patch {patch.name!r} ({patch.vendor_item}) {what}, whose upstream source "
            f"fingerprint is {found} but the patch was written against {declared or patch.fingerprint} at {pin}. "
            f"Review the patch against the new upstream code and update {pinned}; to run anyway "
            f"(at your own risk) set VERL_PATCHES_ALLOW_DRIFT={patch.name} (or =all)."
        )


@dataclass(frozen=True)
class Patch:
    """One runtime change to upstream code.

    target: "package.module:Qualified.name" (an attribute, method, class attribute or registry
      mapping), or a bare module name for MODULE_ALIAS.
    fingerprint: fingerprint of the target's source at the locked pin (see fingerprint.py), or
      ABSENT for an attribute we add, or "" for a module alias.
    replacement: for REPLACE/REGISTRY a zero-argument factory returning the new object; for WRAP a
      function taking the original and returning the new object; for MODULE_ALIAS unused (`provides`).
    """

    name: str
    target: str
    kind: Kind
    fingerprint: str
    vendor_item: str  # vendor item id(s) glossed in verl_patches/patches/VENDOR_ITEMS.md (e.g. "G1"), or "local"
    reason: str
    devices: tuple[str, ...] = ALL_DEVICES
    replacement: Callable[..., Any] | None = None
    registry_key: tuple[Any, ...] = ()  # REGISTRY: key path inside the mapping
    fingerprint_of: tuple[str, ...] = ()  # fingerprint these sources instead of the target (the code that
    #   relies on the patched object, when the object itself is not upstream code, e.g. an imported name)
    provides: str = ""  # MODULE_ALIAS: our module that stands in
    env_flag: str = ""  # apply only when this environment variable is set to a true value
    env_default: bool = False  # the flag's value when it is unset
    rebind: bool = True  # also rebind other modules' references to the replaced object
    relies_on: tuple[tuple[str, str], ...] = ()  # ("module:qualname", fingerprint) of each upstream object the
    #   replacement calls by name besides its target: each is checked on its own, so drift names the one that changed
    calls_original: bool = True  # WRAP: False when the factory gives the target a new body instead of calling
    #   the original (keeps only its attributes, or recompiles its source): nothing beneath it runs, so it must
    #   be the innermost layer of its target's stack (the registry refuses it over another patch)

    def __post_init__(self) -> None:
        for d in self.devices:
            if d not in DEVICES:
                raise ValueError(f"patch {self.name}: unknown device {d!r}")
        if self.kind is Kind.MODULE_ALIAS:
            if ":" in self.target or not self.provides:
                raise ValueError(f"patch {self.name}: a module alias needs a bare module target and `provides`")
        else:
            if ":" not in self.target:
                raise ValueError(f"patch {self.name}: target must be 'module:qualname', got {self.target!r}")
            if self.replacement is None:
                raise ValueError(f"patch {self.name}: needs a replacement")
        if self.kind is Kind.REGISTRY and not self.registry_key:
            raise ValueError(f"patch {self.name}: a registry patch needs registry_key")
        if not self.calls_original and self.kind is not Kind.WRAP:
            raise ValueError(f"patch {self.name}: calls_original=False is for a WRAP patch")
        for relied, pin in self.relies_on:
            if ":" not in relied or not pin.startswith("sha256:"):
                raise ValueError(
                    f"patch {self.name}: relies_on entries are ('module:qualname', 'sha256:...'), got {(relied, pin)!r}"
                )

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.target.split(":", 1)[1] if ":" in self.target else ""

    @property
    def fingerprint_targets(self) -> tuple[str, ...]:
        return self.fingerprint_of or (self.target,)

    def condition_text(self) -> str:
        if not self.env_flag:
            return ""
        return f"env {self.env_flag}={'1' if self.env_default else '0'} by default"

    def condition_holds(self, device: str) -> tuple[bool, str]:
        if device not in self.devices:
            return False, f"device is {device}; applies on {','.join(self.devices)}"
        if self.env_flag and not self.env_flag_on():
            return False, f"{self.env_flag} is off"
        return True, ""

    def env_flag_on(self, environ: Mapping[str, str] | None = None) -> bool:
        """The value of this patch's switch in `environ` (default: this process's environment; True when the
        patch has none), in the one grammar of `verl_patches.base.env_flags` (an unknown value is an error)."""
        return True if not self.env_flag else env_registry.flag(self.env_flag, environ, default=self.env_default)


def _resolve(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def lazy_object(path: str) -> Callable[[], Any]:
    """Replacement factory: the object at "module:name", imported only when the patch applies."""

    def factory() -> Any:
        return _resolve(path)

    factory.__qualname__ = f"lazy_object({path!r})"
    return factory


def lazy_call(path: str) -> Callable[..., Any]:
    """Replacement factory: call the function at "module:name" with the factory's arguments (the
    original for WRAP, nothing for a REPLACE builder), importing it only when the patch applies."""

    def factory(*args: Any) -> Any:
        return _resolve(path)(*args)

    factory.__qualname__ = f"lazy_call({path!r})"
    return factory


# The common declarations, each without the two fields its kind fixes: the kind itself and how the replacement
# is found (by import path, only when the patch applies). `options` are Patch's other fields (devices, rebind,
# fingerprint_of, relies_on, calls_original, env_flag...). A patch switched by an environment variable stays a
# plain `Patch(...)`: tests/ci/test_env_registry.py finds the variables it declares there.


def replace(*, name: str, target: str, fingerprint: str, by: str = "", built_by: str = "", **options: Any) -> Patch:
    """A REPLACE patch: the target becomes the object at `by` ("module:name"), or what the function at
    `built_by` returns when called with no argument; exactly one of the two."""
    if bool(by) == bool(built_by):
        raise ValueError(f"patch {name}: replace() takes exactly one of by= and built_by=")
    replacement = lazy_object(by) if by else lazy_call(built_by)
    return Patch(
        name=name, target=target, kind=Kind.REPLACE, fingerprint=fingerprint, replacement=replacement, **options
    )


def wrap(*, name: str, target: str, fingerprint: str, by: str, **options: Any) -> Patch:
    """A WRAP patch: the target becomes what the function at `by` ("module:name") returns for the original."""
    return Patch(
        name=name, target=target, kind=Kind.WRAP, fingerprint=fingerprint, replacement=lazy_call(by), **options
    )


def module_alias(*, name: str, target: str, provides: str, **options: Any) -> Patch:
    """A MODULE_ALIAS patch: where module `target` is absent, our module `provides` stands in (no upstream
    source to fingerprint)."""
    return Patch(name=name, target=target, kind=Kind.MODULE_ALIAS, fingerprint="", provides=provides, **options)
