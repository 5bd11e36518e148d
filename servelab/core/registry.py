"""Name -> class registries for policies, routers and cost models.

Each policy module registers itself with a decorator, and ``load_plugins`` imports every
module of the plugin packages (``servelab.baselines`` and every design folder under
``servelab.designs``), so adding a policy touches its own folder only. A registered class may define a
nested frozen ``Config`` dataclass; ``create`` builds it from keyword parameters (strings
from the CLI are converted to the field's type) so bad parameters fail with a clear error.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RegistryError(ValueError):
    pass


class Registry(Generic[T]):
    def __init__(self, kind: str, plugin_packages: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._plugin_packages = plugin_packages
        self._loaded = not plugin_packages
        self._classes: dict[str, type[T]] = {}

    def register(self, name: str):
        def decorate(cls: type[T]) -> type[T]:
            if name in self._classes and self._classes[name] is not cls:
                raise RegistryError(f"{self.kind} {name!r} registered twice")
            self._classes[name] = cls
            cls.name = name  # type: ignore[attr-defined]
            return cls

        return decorate

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True
            for package in self._plugin_packages:
                load_plugins(package)

    def names(self) -> list[str]:
        self._ensure_loaded()
        return sorted(self._classes)

    def get(self, name: str) -> type[T]:
        self._ensure_loaded()
        try:
            return self._classes[name]
        except KeyError:
            raise RegistryError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}") from None

    def create(self, name: str, params: dict[str, Any] | None = None, **context: Any) -> T:
        """Instantiate ``name``; ``params`` fill its Config, ``context`` goes to the constructor."""
        cls = self.get(name)
        config = build_config(getattr(cls, "Config", None), params or {}, f"{self.kind} {name!r}")
        return cls(config, **context) if config is not None else cls(**context)  # type: ignore[call-arg]


def load_plugins(package: str) -> None:
    """Import every public module and sub-package of ``package`` (a design's ``__init__``
    imports the modules that register its policy and router)."""
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


def build_config(config_cls: type | None, params: dict[str, Any], where: str):
    if config_cls is None:
        if params:
            raise RegistryError(f"{where} takes no parameters, got {sorted(params)}")
        return None
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise RegistryError(f"{where}: unknown parameter(s) {unknown}; valid: {sorted(fields)}")
    hints = typing.get_type_hints(config_cls)
    kwargs = {k: coerce(v, hints[k], f"{where} parameter {k!r}") for k, v in params.items()}
    try:
        return config_cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise RegistryError(f"{where}: {exc}") from None


def coerce(value: Any, hint: Any, where: str) -> Any:
    """Convert a CLI string to the annotated type (int, float, bool, str, Optional, tuple)."""
    if not isinstance(value, str):
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value.lower() in ("none", "null", ""):
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(value, inner[0], where) if inner else value
    if origin is tuple:
        item = args[0] if args else str
        return tuple(coerce(v, item, where) for v in value.replace(";", ",").split(",") if v)
    try:
        if hint is bool:
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if hint in (int, float, str):
            return hint(value)
    except ValueError:
        raise RegistryError(f"{where}: cannot read {value!r} as {getattr(hint, '__name__', hint)}") from None
    if isinstance(hint, type) and issubclass(hint, __import__("enum").Enum):
        try:
            return hint(value)
        except ValueError:
            raise RegistryError(f"{where}: {value!r} is not one of {[m.value for m in hint]}") from None
    return value


def parse_name_params(text: str) -> tuple[str, dict[str, str]]:
    """'sarathi:token_budget=512,max_num_seqs=64' -> ('sarathi', {...})."""
    name, _, rest = text.partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, val = item.partition("=")
        if not eq:
            raise RegistryError(f"{text!r}: expected key=value, got {item!r}")
        params[key.strip()] = val.strip()
    return name.strip(), params
