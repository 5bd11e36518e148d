"""Name -> class registries for policies, routers and cost models.

Each policy module registers itself with a decorator, and ``load_plugins`` imports every
module of the plugin packages (``servelab.baselines`` and every design folder under
``servelab.designs``), so adding a policy touches its own folder only. A registered class may define a
nested frozen ``Config`` dataclass; ``create`` builds it from keyword parameters so bad
parameters fail with a one-line error naming the policy and the parameter.

Parameters are validated against the Config's annotations with pydantic, one field at a
time. Strings (the CLI's spec strings) are read leniently as their type (``"8"`` -> 8,
``"yes"`` -> True, ``"none"`` -> None, ``"1;2"`` -> a tuple); other values (the Python API) must
already have the type, so ``True`` is never read as 1. Every float must be finite and every
int must fit ``MAX_PARAM_INT``, and every duration (a field named ``*_s``) ``MAX_PARAM_SECONDS``:
an infinite wait or a 10^30 batch size is a typo, not a setting. The Config's own
``__post_init__`` then checks ranges and relations.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import types
import typing
from typing import Any, Generic, TypeVar

from pydantic import ConfigDict, TypeAdapter, ValidationError

from servelab.core.errors import UserError, shown
from servelab.core.limits import MAX_PARAM_INT, MAX_PARAM_SECONDS

T = TypeVar("T")


class RegistryError(UserError):
    """An unknown name, or a parameter that cannot be used; the message names which."""


class Registry(Generic[T]):
    def __init__(self, kind: str, plugin_packages: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._plugin_packages = plugin_packages
        self._loaded = not plugin_packages
        self._classes: dict[str, type[T]] = {}
        self._hidden: set[str] = set()

    def register(self, name: str, *, hidden: bool = False):
        """``hidden`` marks a building block of another design (built by its preset): it can be
        created by name but is left out of ``names()``, so listings and errors show what a user
        would pick."""
        def decorate(cls: type[T]) -> type[T]:
            if name in self._classes and self._classes[name] is not cls:
                raise ValueError(f"{self.kind} {name!r} registered twice")  # a bug, not user input
            self._classes[name] = cls
            if hidden:
                self._hidden.add(name)
            cls.name = name  # type: ignore[attr-defined]
            return cls

        return decorate

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True
            for package in self._plugin_packages:
                load_plugins(package)

    def names(self, *, include_hidden: bool = False) -> list[str]:
        self._ensure_loaded()
        return sorted(n for n in self._classes if include_hidden or n not in self._hidden)

    def has(self, name: str) -> bool:
        self._ensure_loaded()
        return name in self._classes

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
    """The Config for ``params``: unknown keys, unreadable values and failed checks raise
    ``RegistryError`` naming ``where`` (e.g. ``policy 'static'``) and the parameter."""
    if config_cls is None:
        if params:
            raise RegistryError(f"{where} takes no parameters, got {sorted(params)}")
        return None
    fields = {f.name for f in dataclasses.fields(config_cls) if f.init}
    unknown = sorted(set(params) - fields)
    if unknown:
        raise RegistryError(f"{where}: unknown parameter(s) {unknown}; valid: {sorted(fields)}")
    hints = typing.get_type_hints(config_cls, include_extras=True)
    kwargs = {k: coerce_param(v, hints[k], f"{where} parameter {k!r}") for k, v in params.items()}
    for key, value in kwargs.items():
        if key.endswith("_s") and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and value > MAX_PARAM_SECONDS:
            raise RegistryError(f"{where} parameter {key!r}: a duration of at most {MAX_PARAM_SECONDS:g} s, "
                                f"got {shown(value)}")
    try:
        return config_cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise RegistryError(f"{where}: {exc}") from None


_NONE_WORDS = ("none", "null", "")


def coerce_param(value: Any, hint: Any, where: str) -> Any:
    """``value`` as the annotated type ``hint`` (int, float, bool, str, Enum, Optional, tuple).

    A string is read as the CLI writes it; any other value must already have the type.
    """
    from_text = isinstance(value, str)
    if from_text:
        value = _split_text(value, hint)
    elif isinstance(value, list) and typing.get_origin(hint) is tuple:
        value = tuple(value)
    try:
        result = _adapter(hint).validate_python(value, strict=not from_text)
    except ValidationError as exc:
        error = exc.errors()[0]
        message = error["msg"].split(", unable to")[0]  # pydantic's "..., unable to parse string as an integer"
        message = message[:1].lower() + message[1:]
        at = "".join(f"[{i}]" for i in error["loc"] if isinstance(i, int))
        raise RegistryError(f"{where}{at}: {message}, got {shown(error.get('input', value))}") from None
    for item in result if isinstance(result, tuple) else (result,):
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_PARAM_INT:
            raise RegistryError(f"{where}: must be between {-MAX_PARAM_INT:,} and {MAX_PARAM_INT:,}, got {shown(item)}")
    return result


def _split_text(text: str, hint: Any) -> Any:
    """CLI spellings: ``none`` for an Optional's None, ``a;b`` or ``a,b`` for a tuple."""
    text = text.strip()
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        if text.lower() in _NONE_WORDS:
            return None
        inner = [a for a in args if a is not type(None)]
        return _split_text(text, inner[0]) if len(inner) == 1 else text
    if typing.get_origin(hint) is tuple:
        return [item.strip() for item in text.replace(";", ",").split(",") if item.strip()]
    return text


@functools.cache
def _adapter(hint: Any) -> TypeAdapter:
    return TypeAdapter(hint, config=ConfigDict(allow_inf_nan=False))


def parse_name_params(text: str, what: str = "policy spec") -> tuple[str, dict[str, str]]:
    """'sarathi:token_budget=512,max_num_seqs=64' -> ('sarathi', {...}); a key given twice,
    an empty key or a piece without ``=`` is a ``RegistryError`` quoting the spec."""
    name, _, rest = text.partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, val = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise RegistryError(f"{what} {text!r}: expected key=value, got {item!r}")
        if key in params:
            raise RegistryError(f"{what} {text!r}: parameter {key!r} given twice")
        params[key] = val.strip()
    return name.strip(), params
