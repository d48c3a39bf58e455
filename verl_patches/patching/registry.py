"""Apply declared patches in a defined order, rebind stale references, record a manifest, revert.

Order: the catalog's order. A patch whose target module is already imported applies at activation;
one whose module is not imported yet applies the moment that module finishes executing (via the
post-import hook), before any other module can `from target import name`. After applying, every
module of the upstream packages that holds the replaced object under any name is rebound to the new
one, so `from x import f` copies made earlier do not keep the stale function.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_patches.base import env_registry
from verl_patches.device import device_kind
from verl_patches.patching import import_hook
from verl_patches.patching.activation_record import write_record
from verl_patches.patching.declaration import ABSENT, Kind, Patch, PatchDriftError, PatchError
from verl_patches.patching.fingerprint import FingerprintError, fingerprint_target
from verl_patches.sources.lock import load_lock

logger = logging.getLogger("verl_patches")

# Packages whose modules are scanned for stale references and watched for imports.
UPSTREAM_ROOTS = {"verl", "vllm", "vllm_ascend", "megatron", "mindspeed", "mindspeed_llm"}
MARKER = "__verl_patch__"  # set on every object we install: makes re-application a no-op
_MISSING = object()


@dataclass
class Record:
    patch: Patch
    status: str = (
        "declared"  # applied | applied-with-drift | pending | skipped | not-needed | unavailable | drift | reverted
    )
    detail: str = ""
    found_fingerprint: str = ""
    original: Any = _MISSING
    new: Any = _MISSING
    owner: Any = None  # the module, class or mapping whose slot we set
    slot: Any = None  # attribute name or mapping key
    rebound: list[tuple[dict[str, Any], str]] = field(default_factory=list)  # (namespace, name)
    created_modules: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        p = self.patch
        return {
            "name": p.name,
            "target": p.target,
            "kind": p.kind.value,
            "vendor_item": p.vendor_item,
            "reason": p.reason,
            "devices": list(p.devices),
            "condition": p.condition_text(),
            "status": self.status,
            "detail": self.detail,
            "declared_fingerprint": p.fingerprint,
            "found_fingerprint": self.found_fingerprint,
            "rebound": len(self.rebound),
            "pid": os.getpid(),
        }


def _drift_allowed(name: str) -> bool:
    allowed = set(env_registry.items("VERL_PATCHES_ALLOW_DRIFT"))
    return "all" in allowed or name in allowed


def lock_pin(module: str) -> str:
    """ "verl refs/tags/v0.4.0 @ 0758489422e8" for the component that owns a module, for messages."""
    top = module.partition(".")[0]
    try:
        lock = load_lock(Path(__file__).resolve().parents[2] / "sources.lock")
        for c in lock.components.values():
            if c.package == top:
                return f"{c.name} {c.ref} @ {c.commit[:12]} (sources.lock)"
    except Exception:  # the pin is only decoration for a message; never hide the real error
        pass
    return f"{top} (not pinned by sources.lock)"


class Registry:
    def __init__(self, patches: list[Patch], device: str) -> None:
        names = [p.name for p in patches]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise PatchError(f"duplicate patch names: {sorted(dupes)}")
        self.device = device
        self.records = [Record(p) for p in patches]
        # Only modules with a pending patch are hooked, so other imports (and their tracebacks) never
        # pass through our code.
        self._hook = import_hook.PostImportHook(self._has_pending, self._on_module_loaded)
        # Asked on every import of the process: a set lookup, not a scan of the records. A superset of the
        # modules with pending patches is harmless (the callback checks each record's status).
        self._pending_modules: set[str] = set()
        self._watched_parents: dict[str, types.ModuleType] = {}
        self._lock = threading.RLock()
        self.active = False

    # ---- activation -------------------------------------------------------------------------
    def activate(self) -> Registry:
        with self._lock:
            if self.active:
                return self
            self.active = True
            import_hook.install(self._hook)
            applied: list[Record] = []
            try:
                for rec in self.records:
                    ok, why = rec.patch.condition_holds(self.device)
                    if not ok:
                        rec.status, rec.detail = "skipped", why
                        continue
                    loaded = sys.modules.get(rec.patch.module)
                    if rec.patch.kind is Kind.MODULE_ALIAS or (loaded is not None and not _initializing(loaded)):
                        self._apply(rec)
                        applied.append(rec)
                    else:
                        rec.status, rec.detail = "pending", f"applies when {rec.patch.module} is imported"
                        self._pending_modules.add(rec.patch.module)
                        if loaded is not None:  # still executing: it is the module that imported the prelude
                            self._when_finished(loaded)
            finally:  # what did apply is rebound even when a later patch raises
                self._rebind_everywhere(applied)
        return self

    def _when_finished(self, module: types.ModuleType) -> None:
        """Run the post-import callback for a module that is executing right now (verl's megatron_workers
        imports the prelude from its first lines): the import system's last step for a submodule is
        setattr(parent_package, child, module), which a ModuleType subclass on the parent can observe."""
        parent_name, _, child = module.__name__.rpartition(".")
        parent = sys.modules.get(parent_name)
        if parent is None or type(parent) is not types.ModuleType or parent_name in self._watched_parents:
            return  # a top-level module or a custom module class: resolve_pending() applies it later
        registry = self

        class _ParentWatchingChild(types.ModuleType):
            def __setattr__(self, name: str, value: Any) -> None:
                types.ModuleType.__setattr__(self, name, value)
                if name == child and value is module:
                    registry._stop_watching(parent_name)
                    registry._on_module_loaded(module)

        parent.__class__ = _ParentWatchingChild
        self._watched_parents[parent_name] = parent

    def _stop_watching(self, parent_name: str) -> None:
        parent = self._watched_parents.pop(parent_name, None)
        if parent is not None and type(parent) is not types.ModuleType:
            parent.__class__ = types.ModuleType

    def _has_pending(self, module_name: str) -> bool:
        return module_name in self._pending_modules

    def _on_module_loaded(self, module: types.ModuleType) -> None:
        with self._lock:
            applied: list[Record] = []
            try:
                for rec in self.records:
                    if rec.status == "pending" and rec.patch.module == module.__name__:
                        self._apply(rec)
                        applied.append(rec)
            finally:
                self._rebind_everywhere(applied)
                if not any(r.status == "pending" and r.patch.module == module.__name__ for r in self.records):
                    self._pending_modules.discard(module.__name__)
            self._rebind_in(module)

    def resolve_pending(self) -> None:
        """Import every pending target now; a module that cannot import makes its patch 'unavailable'."""
        for rec in self.records:
            if rec.status != "pending":
                continue
            try:
                importlib.import_module(rec.patch.module)
            except PatchDriftError:
                raise
            except Exception as e:  # ImportError, or any error an upstream module raises while importing here
                rec.status = "unavailable"
                rec.detail = f"cannot import {rec.patch.module} on this host: {type(e).__name__}: {e}"
                continue
            if rec.status == "pending":  # imported before the hook was installed
                self._apply(rec)
                self._rebind_everywhere([rec])

    # ---- applying ---------------------------------------------------------------------------
    def _check_fingerprint(self, rec: Record) -> None:
        """The target's pin, then each upstream object the replacement relies on, each on its own."""
        p = rec.patch
        if p.fingerprint not in ("", ABSENT) or p.fingerprint_of:
            rec.found_fingerprint, detail = _found_fingerprint(p.fingerprint_targets)
            if rec.found_fingerprint != p.fingerprint:
                pin = lock_pin(p.fingerprint_targets[0].split(":")[0])
                self._drifted(rec, PatchDriftError(p, rec.found_fingerprint, pin), detail)
        for relied, declared in p.relies_on:
            found, detail = _found_fingerprint((relied,))
            if found != declared:
                pin = lock_pin(relied.split(":")[0])
                self._drifted(rec, PatchDriftError(p, found, pin, relied_on=relied, declared=declared), detail)

    @staticmethod
    def _drifted(rec: Record, err: PatchDriftError, detail: str) -> None:
        """Raise `err` (the record says drift), or, where VERL_PATCHES_ALLOW_DRIFT names the patch, warn."""
        if detail:
            err.args = (f"{err.args[0]} ({detail})",)
        if _drift_allowed(rec.patch.name):
            logger.warning("DRIFT ALLOWED BY VERL_PATCHES_ALLOW_DRIFT: %s", err)
            what = f"found {err.found}" + (f" for {err.relied_on}" if err.relied_on else "")
            prior = rec.detail if rec.detail.startswith("applied despite drift") else ""
            rec.detail = f"{prior}; {what}" if prior else f"applied despite drift: {what}"
            return
        rec.status, rec.detail = "drift", str(err)
        raise err

    def _resolve_slot(self, rec: Record) -> tuple[Any, Any, Any]:
        """(owner, slot, current raw value or _MISSING) of an attribute or registry target."""
        p = rec.patch
        owner: Any = sys.modules[p.module]
        parts = p.qualname.split(".")
        for part in parts[:-1]:
            owner = getattr(owner, part)
        slot: Any = parts[-1]
        if p.kind is Kind.REGISTRY:
            owner = getattr(owner, slot)
            for key in p.registry_key[:-1]:
                owner = owner[key]
            slot = p.registry_key[-1]
            return owner, slot, owner.get(slot, _MISSING) if hasattr(owner, "get") else owner[slot]
        if isinstance(owner, type):
            return (
                owner,
                slot,
                owner.__dict__.get(slot, _MISSING) if slot in owner.__dict__ else getattr(owner, slot, _MISSING),
            )
        return owner, slot, getattr(owner, slot, _MISSING)

    def _apply(self, rec: Record) -> None:
        p = rec.patch
        rec.detail = ""  # drop "applies when ... is imported" left by the pending state
        if p.kind is Kind.MODULE_ALIAS:
            return self._apply_alias(rec)
        stand_in = getattr(sys.modules.get(p.module), MARKER, None)
        if stand_in is not None:
            # Our own stand-in module already provides the object (lazily): replacing an attribute of it
            # would only import the replacement's dependencies early (e.g. MindSpeed and torch_npu).
            rec.status, rec.detail = "not-needed", f"{p.module} is our stand-in (patch {stand_in})"
            return
        owner, slot, current = self._resolve_slot(rec)
        if current is not _MISSING and getattr(_unwrap(current), MARKER, None) == p.name:
            rec.status, rec.detail = "applied", "already in place (applied earlier in this process)"
            return
        if p.fingerprint == ABSENT and current is not _MISSING:
            found = "present"
            rec.found_fingerprint = found
            err = PatchDriftError(p, found, lock_pin(p.module))
            err.args = (f"patch {p.name!r} adds {p.target}, but upstream now defines it; review the patch",)
            if not _drift_allowed(p.name):
                rec.status, rec.detail = "drift", str(err)
                raise err
            logger.warning("DRIFT ALLOWED BY VERL_PATCHES_ALLOW_DRIFT: %s", err)
            rec.detail = f"applied despite drift: found {found}"
        self._check_fingerprint(rec)
        beneath = getattr(_unwrap(current), MARKER, None) if current is not _MISSING else None
        if p.kind is Kind.WRAP and not p.calls_original and beneath is not None:
            # it would silently discard the patch beneath it: the catalog order is wrong
            raise PatchError(
                f"patch {p.name!r} gives {p.target} a new body without calling what it wraps, so patch "
                f"{beneath!r}, applied before it, would never run; declare {p.name!r} before {beneath!r} "
                f"(verl_patches.patches.catalog order)"
            )
        try:
            if p.kind is Kind.WRAP:
                if current is _MISSING:
                    raise PatchError(f"patch {p.name}: {p.target} does not exist, nothing to wrap")
                new = _rewrap(current, p.replacement)
            else:
                assert p.replacement is not None  # Patch.__post_init__: every kind but MODULE_ALIAS has one
                new = p.replacement()
        except ImportError as e:  # the replacement's own dependency is missing on this host: record it, never crash
            rec.status = "unavailable"
            rec.detail = f"replacement for {p.target} cannot import on this host: {type(e).__name__}: {e}"
            return
        _mark(new, p.name)
        if p.kind is Kind.REGISTRY:
            owner[slot] = new
        else:
            setattr(owner, slot, new)
        rec.original, rec.new, rec.owner, rec.slot = current, new, owner, slot
        rec.status = "applied" if not rec.detail.startswith("applied despite drift") else "applied-with-drift"
        rec.rebound = []  # filled by _rebind_everywhere, once per batch of applied patches
        logger.debug("verl_patches: applied %s to %s", p.name, p.target)

    def _apply_alias(self, rec: Record) -> None:
        p = rec.patch
        top = p.target.partition(".")[0]
        real = sys.modules.get(p.target)
        if real is not None and getattr(real, MARKER, None) == p.name:
            rec.status, rec.detail = "applied", "already in place (applied earlier in this process)"
            return
        if real is not None:
            rec.status, rec.detail = "not-needed", f"{p.target} is already imported (not ours)"
            return
        try:
            real_spec = importlib.util.find_spec(top) if top not in sys.modules else sys.modules[top].__spec__
        except (ImportError, ValueError):
            real_spec = None
        if real_spec is not None and getattr(sys.modules.get(top), MARKER, None) is None:
            rec.status, rec.detail = "not-needed", f"the real {top} is installed"
            return
        module = importlib.import_module(p.provides)
        parts = p.target.split(".")
        for i in range(1, len(parts)):
            name = ".".join(parts[:i])
            if name not in sys.modules:
                pkg = types.ModuleType(name, f"Stand-in package created by verl_patches for {p.target}")
                pkg.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
                pkg.__path__ = []
                setattr(pkg, MARKER, p.name)
                sys.modules[name] = pkg
                rec.created_modules.append(name)
                if i > 1:
                    setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], pkg)
        setattr(module, MARKER, p.name)
        sys.modules[p.target] = module
        rec.created_modules.append(p.target)
        setattr(sys.modules[".".join(parts[:-1])], parts[-1], module)
        rec.status, rec.detail = "applied", f"{p.target} is {p.provides}"

    # ---- rebinding --------------------------------------------------------------------------
    @staticmethod
    def _rebinds(rec: Record) -> bool:
        # A registry entry is looked up through the mapping; the function it held stays valid elsewhere.
        return (
            rec.status in ("applied", "applied-with-drift")
            and rec.original is not _MISSING
            and rec.new is not _MISSING
            and rec.patch.kind not in (Kind.REGISTRY, Kind.MODULE_ALIAS)
            and rec.patch.rebind
        )

    def _rebind_everywhere(self, recs: list[Record]) -> None:
        """Rebind stale references to the replaced objects in the upstream trees and in each target's own
        package (not in all of site-packages). With torch and transformers loaded this is a scan of thousands
        of module namespaces, so it is one pass for a batch of patches, allocating nothing per entry."""
        todo = [r for r in recs if self._rebinds(r)]
        if not todo:
            return
        by_old = {id(_unwrap(r.original)): r for r in todo}
        scope = UPSTREAM_ROOTS | {r.patch.module.partition(".")[0] for r in todo}
        # list(sys.modules) is one allocation; list(sys.modules.items()) would keep thousands of tuples alive
        # at once and, right after torch/transformers load, trigger a full collection of their heap here.
        for mname in list(sys.modules):
            top = mname.partition(".")[0]
            mod = sys.modules.get(mname)
            if mod is None or top not in scope:
                continue
            ns = getattr(mod, "__dict__", None)
            if not ns:
                continue
            hits = [key for key, value in ns.items() if id(value) in by_old]
            for key in hits:
                value = ns[key]
                rec = by_old.get(id(value))
                # Follow stacked patches (a later one wrapping an earlier one's result) to the newest object.
                while (
                    rec is not None
                    and value is _unwrap(rec.original)
                    and (top in UPSTREAM_ROOTS or top == rec.patch.module.partition(".")[0])
                ):
                    value = _unwrap(rec.new)
                    ns[key] = value
                    rec.rebound.append((ns, key))
                    nxt = by_old.get(id(value))
                    rec = nxt if nxt is not rec else None

    def _rebind_in(self, module: types.ModuleType) -> None:
        ns = getattr(module, "__dict__", {})
        stale = {
            id(_unwrap(r.original)): r
            for r in self.records
            if r.status in ("applied", "applied-with-drift")
            and r.original is not _MISSING
            and r.patch.kind is not Kind.REGISTRY
            and r.patch.rebind
        }
        if not stale:
            return
        for key, value in list(ns.items()):
            rec = stale.get(id(value))
            if rec is not None and value is _unwrap(rec.original):
                ns[key] = _unwrap(rec.new)
                rec.rebound.append((ns, key))

    # ---- reverting and reporting ------------------------------------------------------------
    def revert(self) -> None:
        """Undo everything, newest first (tests only)."""
        with self._lock:
            for rec in reversed(self.records):
                if rec.status not in ("applied", "applied-with-drift"):
                    continue
                if rec.patch.kind is not Kind.MODULE_ALIAS and rec.new is _MISSING:
                    continue  # found already in place: applied by an earlier registry, which owns the original
                for ns, key in reversed(rec.rebound):
                    ns[key] = _unwrap(rec.original)
                if rec.patch.kind is Kind.MODULE_ALIAS:
                    for name in reversed(rec.created_modules):
                        sys.modules.pop(name, None)
                elif rec.patch.kind is Kind.REGISTRY:
                    if rec.original is _MISSING:
                        rec.owner.pop(rec.slot, None)
                    else:
                        rec.owner[rec.slot] = rec.original
                elif rec.original is _MISSING:
                    delattr(rec.owner, rec.slot)
                else:
                    setattr(rec.owner, rec.slot, rec.original)
                rec.status, rec.detail, rec.rebound = "reverted", "", []
            import_hook.uninstall(self._hook)
            for parent_name in list(self._watched_parents):
                self._stop_watching(parent_name)
            self._pending_modules.clear()
            self.active = False

    def manifest(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.records]

    def summary_line(self) -> str:
        counts: dict[str, int] = {}
        for r in self.records:
            counts[r.status] = counts.get(r.status, 0) + 1
        parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        return f"verl_patches active in pid {os.getpid()} (device={self.device}): {len(self.records)} declared: {parts}"


def _found_fingerprint(targets: tuple[str, ...]) -> tuple[str, str]:
    """(fingerprint, "") or ("missing", why) for sources read from where Python finds them."""
    try:
        return fingerprint_target(*targets), ""
    except FingerprintError as e:
        return "missing", str(e)


def _initializing(module: types.ModuleType) -> bool:
    """True while the module's own code is still executing (the import system marks its spec)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _unwrap(obj: Any) -> Any:
    return obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj


def _rewrap(current: Any, factory: Any) -> Any:
    if isinstance(current, (staticmethod, classmethod)):
        return type(current)(factory(current.__func__))
    return factory(current)


def _mark(obj: Any, name: str) -> None:
    try:
        setattr(_unwrap(obj), MARKER, name)
    except (AttributeError, TypeError):
        pass  # builtins and some C objects take no attributes; idempotence then relies on the status


_REGISTRY: Registry | None = None
_REGISTRY_LOCK = threading.Lock()


def get_registry() -> Registry | None:
    return _REGISTRY


def activate(catalog: Callable[[], Sequence[Patch]], device: str | None = None) -> Registry:
    """Create (once per process) and activate the registry with every patch of ``catalog()``.

    The catalog is handed in by the activation point (`verl_patches.prelude_patch`), so this machinery never
    imports the patches it applies; it is called only the first time, as the registry is made once.
    """
    global _REGISTRY
    with _REGISTRY_LOCK:
        if _REGISTRY is None:
            _REGISTRY = Registry(list(catalog()), device or device_kind())
        if not _REGISTRY.active:
            _REGISTRY.activate()
            if not env_registry.flag("VERL_PATCHES_QUIET"):
                print(_REGISTRY.summary_line(), file=sys.stderr, flush=True)

            write_record(_REGISTRY.summary_line(), {r.patch.name: r.status for r in _REGISTRY.records})
    return _REGISTRY
