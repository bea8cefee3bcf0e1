"""Plug-in registries: one table per kind maps a type name to ``(factory, Params)``.

Every plug-in (a routing filter, scorer, picker or policy; an autoscaler; a store; a provider) declares one
pydantic ``Params`` model and a factory taking an instance of it. A ``Registry`` holds them by name, so:

- config validates a plug-in's parameters through a discriminated union built from the registry
  (``Registry.union``), and the generated configuration reference documents every plug-in's fields;
- the names live in one place: ``Registry.names()`` / ``Registry.literal()`` instead of a hand-kept
  ``Literal[...]`` next to a dict of builders;
- code that builds a plug-in by name (the gateway, the simulator, benches) calls ``Registry.build``, which
  validates loose mappings (``--policy-param k=v``, JSON) with the same model.

Pydantic is the only non-standard import: the models are plain validated data, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar, Union, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, create_model

T = TypeVar("T")


class PluginParams(BaseModel):
    """Base of every plug-in's ``Params``: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class Plugin(Generic[T]):
    """One registered plug-in: its type name, its factory (``factory(params, *args, **kw) -> T``) and its
    ``Params`` model."""

    name: str
    factory: Callable[..., T]
    params: type[BaseModel]


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.replace("-", "_").split("_"))


def format_validation_error(kind: str, name: str, exc: ValidationError) -> str:
    """One line per problem, ``field.path: message``, prefixed with the plug-in."""
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(params)"
        problems.append(f"{loc}: {err['msg']}")
    return f"invalid parameters for {kind} {name!r}: " + "; ".join(problems)


class Registry(Generic[T]):
    """Type name -> ``Plugin`` for one kind of plug-in (``kind`` names it in error messages)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._plugins: dict[str, Plugin[T]] = {}

    def add(self, name: str, params: type[BaseModel], factory: Callable[..., T]) -> None:
        """Register ``name``; a name registered twice is a programming error."""
        if name in self._plugins:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._plugins[name] = Plugin(name, factory, params)

    def register(self, name: str, params: type[BaseModel]) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator form of ``add`` for a factory function."""

        def deco(factory: Callable[..., T]) -> Callable[..., T]:
            self.add(name, params, factory)
            return factory

        return deco

    def names(self) -> tuple[str, ...]:
        """Registered names in registration order."""
        return tuple(self._plugins)

    def __contains__(self, name: object) -> bool:
        return name in self._plugins

    def __iter__(self) -> Iterator[Plugin[T]]:
        return iter(self._plugins.values())

    def __len__(self) -> int:
        return len(self._plugins)

    def get(self, name: str) -> Plugin[T]:
        plugin = self._plugins.get(name)
        if plugin is None:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(self._plugins)}")
        return plugin

    def params(self, name: str, raw: BaseModel | Mapping[str, Any] | None = None) -> BaseModel:
        """``raw`` validated as ``name``'s ``Params`` (an instance of it passes through); ``ValueError`` with
        one line per problem otherwise."""
        model = self.get(name).params
        if isinstance(raw, model):
            return raw
        if isinstance(raw, BaseModel):
            raw = raw.model_dump(exclude_unset=True)
        try:
            return model.model_validate(dict(raw or {}))
        except ValidationError as exc:
            raise ValueError(format_validation_error(self.kind, name, exc)) from None

    def build(
        self, name: str, raw: BaseModel | Mapping[str, Any] | None = None, /, *args: Any, **kw: Any
    ) -> T:
        """A new plug-in ``name`` configured by ``raw`` (validated); extra arguments go to the factory."""
        return self.get(name).factory(self.params(name, raw), *args, **kw)

    def literal(self) -> Any:
        """``Literal[<every name>]`` (for a config field that only names a plug-in)."""
        return Literal[self.names()]

    def variants(
        self,
        *,
        tag: str,
        base: type[BaseModel] = PluginParams,
        params_field: str | None = None,
        suffix: str = "",
        doc: Callable[[Plugin[T]], str] | None = None,
        tag_default: bool = False,
    ) -> dict[str, type[BaseModel]]:
        """One config model per plug-in, told apart by the field ``tag`` (``Literal[name]``).

        ``params_field=None``: the plug-in's ``Params`` fields sit next to the tag (``{type: x, a: 1}``); else
        they are nested under that field (``{policy: x, params: {a: 1}}``). Variants subclass ``base`` (for
        shared fields such as a scorer's ``weight``) and are named ``<CamelName><suffix>``.
        ``tag_default``: the tag field defaults to the plug-in's name (for a union whose input may omit the
        tag, see ``tagged_union``).
        """
        out: dict[str, type[BaseModel]] = {}
        for plugin in self:
            tag_field: Any = (
                Literal[plugin.name],
                Field(default=plugin.name, description=f"Selects `{plugin.name}`.")
                if tag_default
                else Field(description=f"Selects `{plugin.name}`."),
            )
            text = doc(plugin) if doc is not None else (plugin.params.__doc__ or "")
            if params_field is None:
                bases = (plugin.params, base) if base is not PluginParams else (plugin.params,)
                out[plugin.name] = create_model(
                    f"{_camel(plugin.name)}{suffix}", __base__=bases, __doc__=text, **{tag: tag_field}
                )
            else:
                nested: Any = (
                    plugin.params,
                    Field(default_factory=plugin.params, description=f"Parameters of `{plugin.name}`."),
                )
                out[plugin.name] = create_model(
                    f"{_camel(plugin.name)}{suffix}",
                    __base__=base,
                    __doc__=text,
                    **{tag: tag_field, params_field: nested},
                )
        return out

    def union(self, *, tag: str, default: str | None = None, **kw: Any) -> Any:
        """The discriminated union of ``variants(tag=tag, **kw)`` (a pydantic field type); input without the
        tag is read as ``default`` when given."""
        variants = self.variants(tag=tag, tag_default=default is not None, **kw)
        return tagged_union(list(variants.values()), tag, default)


def tagged_union(variants: list[type[BaseModel]], tag: str, default: str | None = None) -> Any:
    """``Annotated[Union[variants], discriminator]`` on the field ``tag`` (a single variant stands alone).

    With ``default``, input that omits the tag is read as that variant (``routing: {params: ...}`` means the
    default policy), else the tag is required.
    """
    if len(variants) == 1:
        return variants[0]
    if default is None:
        return Annotated[Union[tuple(variants)], Field(discriminator=tag)]  # noqa: UP007

    def which(value: Any) -> Any:
        if isinstance(value, Mapping):
            return value.get(tag, default)
        if isinstance(value, BaseModel):
            return dict(value).get(tag, default)
        return None

    names = [get_args(m.model_fields[tag].annotation)[0] for m in variants]
    tagged = tuple(Annotated[m, Tag(n)] for m, n in zip(variants, names, strict=True))
    return Annotated[Union[tagged], Discriminator(which)]  # noqa: UP007
