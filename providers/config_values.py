"""The config schema's building blocks, shared by the server and every cloud package.

Every model rejects unknown keys, collects every mistake of a file in one pass, and reports each with its
key path and a fix (``describe_errors``). Values never appear in a message unless they are harmless (a
secret's value never does). There is one duration type (Go's syntax: ``500ms``, ``30s``, ``10m``,
``1h30m``), the same one the CA uses for ``grpc_timeout``.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from providers.config_errors import ConfigError, ConfigProblem

# ---------------------------------------------------------------------------- small value checks


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (v4 and v6)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# A number with a unit, repeated; the units and the lone "0" are exactly what Go's time.ParseDuration takes.
_GO_DURATION = re.compile(r"^[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+$")
_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
DURATION_EXAMPLES = "500ms, 30s, 10m or 1h30m"


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration string (``1h30m``, ``1.5s``, ``-2m``, ``0``); ValueError otherwise."""
    if text in ("0", "+0", "-0"):
        return 0.0
    if not _GO_DURATION.match(text):
        raise ValueError(f"{text!r} is not a duration")
    seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _GO_DURATION_PART.findall(text))
    return -seconds if text.startswith("-") else seconds


def format_duration(seconds: float) -> str:
    """The shortest Go-style spelling of a duration: 0s, 250ms, 30s, 1.5s, 10m, 1h30m."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole_hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{whole_hours:g}h" if whole_hours else "") + (f"{minutes:g}m" if minutes else "")
    return text + (f"{secs:g}s" if secs or not text else "")


# ---------------------------------------------------------------------------- how the reference names a type


@dataclass(frozen=True)
class Shown:
    """How the configuration reference (docs/reference/config.md, ``make reference``) names a value type:
    the types below carry one in their ``Annotated`` metadata."""

    text: str


# ---------------------------------------------------------------------------- errors with a fix


def problem(text: str, fix: str, *, key: str | None = None) -> PydanticCustomError:
    """A mistake at the value being validated (or at the sibling ``key`` of it), with its fix."""
    return PydanticCustomError("config", "{problem}", {"problem": text, "fix": fix, "key": key or ""})


def not_checked(text: str, fix: str, *, key: str | None = None) -> PydanticCustomError:
    """Something ``validate --offline`` leaves unchecked on purpose (a secret, a file, an environment value)."""
    return PydanticCustomError("not_checked", "{problem}", {"problem": text, "fix": fix, "key": key or ""})


def rule_error(key: str | tuple[str, ...], text: str, fix: str, *, checked: bool = True) -> InitErrorDetails:
    """A finding of a rule over several keys of one mapping (``ConfigModel.cross_rules``), at ``key``.

    ``checked=False`` marks something ``validate --offline`` could not check rather than a mistake.
    """
    error_type = problem(text, fix) if checked else not_checked(text, fix)
    return InitErrorDetails(type=error_type, loc=(key,) if isinstance(key, str) else key, input=None)


_CUSTOM_TYPES = ("config", "not_checked")


def _reraisable(error: Any) -> InitErrorDetails:
    ctx = dict(error.get("ctx") or {})
    error_type: Any = error["type"]
    if error_type in _CUSTOM_TYPES:
        error_type = PydanticCustomError(error_type, "{problem}", ctx)
    details = InitErrorDetails(type=error_type, loc=tuple(error["loc"]), input=error.get("input"))
    if ctx and not isinstance(error_type, PydanticCustomError):
        details["ctx"] = ctx
    return details


class ConfigModel(BaseModel):
    """A mapping of the config file: unknown keys refused, frozen once read, inputs never echoed.

    ``cross_rules`` checks what involves several keys of the mapping. It reads the raw mapping, so it
    runs even when some keys are wrong and its findings join theirs: one run reports every mistake.
    The docstring under each field is its meaning in the configuration reference (docs/reference/config.md,
    generated by ``make reference``, which reads it from the source; a test fails on a key without one).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True, coerce_numbers_to_str=True)

    @classmethod
    def cross_rules(cls, raw: Mapping[str, Any], context: Mapping[str, Any]) -> list[InitErrorDetails]:
        return []

    @model_validator(mode="wrap")
    @classmethod
    def _collect_every_mistake(cls, data: Any, handler: Callable[[Any], Any], info: ValidationInfo) -> Any:
        errors: list[InitErrorDetails] = []
        model = None
        try:
            model = handler(data)
        except ValidationError as err:
            errors = [_reraisable(e) for e in err.errors()]
        if isinstance(data, Mapping):
            errors += cls.cross_rules(data, info.context or {})
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return model


# ---------------------------------------------------------------------------- value types


def duration_seconds(value: Any) -> float:
    """Seconds in a config duration (Go syntax; a bare number only when it is 0); a problem otherwise."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise problem("expected a duration", f"write a number with a unit, e.g. {DURATION_EXAMPLES}")
    if isinstance(value, int | float):
        if value == 0:
            return 0.0
        raise problem(
            f"{value:g} has no unit", f"write {value:g}s for seconds (a duration is e.g. {DURATION_EXAMPLES})"
        )
    try:
        return parse_go_duration(value.strip())
    except ValueError:
        raise problem(f"{value!r} is not a duration", f"write a number with a unit, e.g. {DURATION_EXAMPLES}") from None


def duration(minimum: float, maximum: float) -> Any:
    """The one duration type: Go syntax, no bare numbers except 0, within [minimum, maximum] seconds."""

    def check(value: Any, info: ValidationInfo) -> float:
        from_code = info.context is None and isinstance(value, int | float) and not isinstance(value, bool)
        # Code that builds a model directly passes seconds; a file always goes through validation with a context.
        seconds = float(value) if from_code else duration_seconds(value)
        if not minimum <= seconds <= maximum:
            raise problem(
                f"{format_duration(seconds) if seconds >= 0 else value} is out of range",
                f"use a duration from {format_duration(minimum)} to {format_duration(maximum)}",
            )
        return seconds

    shown = Shown(f"duration, {format_duration(minimum)} to {format_duration(maximum)}")
    return Annotated[float, BeforeValidator(check), shown]


def api_base_url(example: str) -> Any:
    """An http(s) base URL without query or fragment; plain http only to a loopback address.

    Credentials travel in every request to a cloud API, so plaintext is only for a local simulator.
    """

    def check(value: Any) -> str:
        text = str(value).strip() if isinstance(value, str) else ""
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise problem(f"{text or value!r} is not an http(s) URL", f"write it like {example}")
        if parts.query or parts.fragment:
            raise problem(f"{text!r} has a query or fragment", "give only scheme, host, port and path")
        if parts.scheme == "http" and not is_loopback(parts.hostname):
            raise problem(
                f"{text!r} would send credentials unencrypted",
                "use https:// (http is allowed only for loopback test servers)",
            )
        return text.rstrip("/")

    return Annotated[str, BeforeValidator(check), Shown("https URL (http only to a loopback address)")]


def whole_number(minimum: int, maximum: int, example: int) -> Any:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise problem("expected a whole number", f"write e.g. {example}")
        if not minimum <= value <= maximum:
            raise problem(f"{value} is out of range", f"use a number from {minimum} to {maximum} (e.g. {example})")
        return value

    return Annotated[int, BeforeValidator(check), Shown(f"whole number, {minimum} to {maximum}")]


def flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise problem("expected true or false", "write true or false")
    return value


Flag = Annotated[bool, BeforeValidator(flag), Shown("true or false")]


def one_of(
    choices: Sequence[str], what: str, *, normalise: Callable[[str], str] = str, allow_empty: bool = False
) -> Any:
    def check(value: Any) -> str:
        text = normalise(value.strip()) if isinstance(value, str) else value
        if text in (None, ""):
            if allow_empty:
                return ""
            raise problem(f"no {what} is given", f"use one of: {', '.join(choices)}")
        if text not in choices:
            close = difflib.get_close_matches(str(text).lower(), choices, n=1, cutoff=0.6)
            if close:
                raise problem(f"{value!r} is not a {what} (did you mean {close[0]}?)", f"write {close[0]}")
            raise problem(f"{value!r} is not a {what}", f"use one of: {', '.join(choices)}")
        return str(text)

    return Annotated[str, BeforeValidator(check), Shown("one of " + ", ".join(f"`{c}`" for c in choices))]


# ---------------------------------------------------------------------------- secrets and the environment

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def give_variable(name: str, what: str, context: Mapping[str, Any] | None) -> str:
    """How to give the server the environment variable ``name`` (holding ``what``): in the environment of its
    container, where ``serve`` runs; with a shell export as well where the command runs in a shell
    (``validate``: the context's ``shell``)."""
    container = f"set {name} in the server container's environment (a key of the Secret its envFrom names)"
    if (context or {}).get("shell"):
        return f"export {name}=<{what}> to check it here; for the server, {container}"
    return container


@dataclass(frozen=True)
class EnvReference:
    """``<secret>_env: NAME`` from the file: the secret is read from variable NAME."""

    name: Any
    also_inline: bool  # the file sets the secret itself too


def secret_value(value: Any, info: ValidationInfo) -> str:
    """A secret from the file, an upstream variable or a named variable; its value is never echoed."""
    context = info.context or {}
    name = info.field_name or "secret"
    if isinstance(value, EnvReference):
        env_key = f"{name}_env"
        if not isinstance(value.name, str) or not _ENV_NAME.match(value.name):
            # Do not echo the value: a secret pasted here by mistake must not reach the logs.
            raise problem(
                "the value is not an environment variable name",
                f"give the NAME of the variable that holds the {name.replace('_', ' ')}, not the secret itself",
                key=env_key,
            )
        if value.also_inline:
            raise problem(
                f"both {name} and {env_key} are set",
                f"keep only {env_key} (it keeps the secret out of the file)",
                key=env_key,
            )
        if context.get("offline"):
            raise not_checked(
                f"read from environment variable {value.name} at run time",
                f"run validate without --offline where {value.name} is set",
                key=env_key,
            )
        found = str(context.get("env", {}).get(value.name) or "").strip()
        if not found:
            raise problem(
                f"environment variable {value.name} is not set or empty",
                give_variable(value.name, f"the {name.replace('_', ' ')}", context),
                key=env_key,
            )
        return found
    if value is None:
        return ""
    if not isinstance(value, str):
        raise problem(f"expected a string, got {type(value).__name__}", "quote the value")
    return value.strip()


Secret = Annotated[str, BeforeValidator(secret_value), Field(repr=False), Shown("secret string")]


class CloudSettings(ConfigModel):
    """Keys every cloud has, with the same meaning, range and default on each."""

    #: config key -> the upstream provider's environment variable that overrides it (non-empty values only)
    ENV_OVERRIDES: ClassVar[Mapping[str, str]] = {}
    #: secret keys; each may instead be named in ``<key>_env``
    SECRET_FIELDS: ClassVar[tuple[str, ...]] = ()

    request_timeout: duration(0.1, 300.0) = 30.0  # type: ignore[valid-type]
    """Cap of one HTTP attempt to the cloud API; the CA's deadline of the call caps it further."""
    max_attempts: whole_number(1, 10, 4) = 4  # type: ignore[valid-type]
    """Attempts of one idempotent cloud call, the first included (retries back off, and honour Retry-After)."""

    @property
    def secrets(self) -> tuple[str, ...]:
        """Values that must never appear in messages or logs (for log redaction)."""
        return tuple(value for value in (getattr(self, name) for name in self.SECRET_FIELDS) if value)

    @classmethod
    def merge_environment(
        cls, raw: Mapping[str, Any], env: Mapping[str, str], env_applies: bool, offline: bool
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The mapping as validation sees it, and which keys came from which variable.

        The upstream variables win over the file when this is the only backend of its cloud (and are
        ignored otherwise: they could not say which backend they mean). ``<secret>_env`` becomes a
        reference that validation resolves. Offline, no secret is read from the environment.
        """
        merged = dict(raw)
        sources: dict[str, str] = {}
        if env_applies:
            for key, variable in cls.ENV_OVERRIDES.items():
                if offline and key in cls.SECRET_FIELDS:
                    continue
                value = (env.get(variable) or "").strip()
                if value:
                    merged[key] = value
                    sources[key] = variable
        for key in cls.SECRET_FIELDS:
            env_key = f"{key}_env"
            if env_key not in merged:
                continue
            name = merged.pop(env_key)
            if key not in sources:  # an upstream variable beats a named one
                merged[key] = EnvReference(name, also_inline=key in raw)
        return merged, sources


def validate_cloud_settings(
    model: type[CloudSettings],
    key: str,
    raw: Mapping[str, Any],
    env: Mapping[str, str],
    env_applies: bool,
    *,
    offline: bool = False,
) -> Any:
    """One cloud mapping on its own (tests and tools); the server validates it inside the whole file."""
    if not isinstance(raw, Mapping):
        raise ConfigError.single(key, "expected a mapping", "write it as key: value pairs")
    merged, sources = model.merge_environment(raw, env, env_applies, offline)
    try:
        return model.model_validate(merged, context={"env": env, "offline": offline})
    except ValidationError as err:
        problems, unchecked = describe_errors(err, model, prefix=key, sources={(k,): v for k, v in sources.items()})
        raise ConfigError(problems or unchecked) from None


# ---------------------------------------------------------------------------- reporting


def render_key(loc: Sequence[Any], prefix: str = "") -> str:
    text = prefix
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _strip(annotation: Any) -> Any:
    """The model or container type behind Annotated[...] and Optional[...]."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            choices = [a for a in get_args(annotation) if a is not type(None)]
            annotation = choices[0] if len(choices) == 1 else annotation
            if len(choices) != 1:
                return annotation
        else:
            return annotation


def _model_at(root: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel] | None:
    current: Any = root
    for part in loc:
        current = _strip(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            fields = {(f.alias or name): f for name, f in current.model_fields.items()}
            if part not in fields:
                return None
            current = fields[part].annotation
        elif get_origin(current) in (list, tuple, Sequence):
            current = get_args(current)[0]
        elif get_origin(current) in (dict, Mapping):
            current = get_args(current)[1]
        else:
            return None
    current = _strip(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _accepted_keys(model: type[BaseModel] | None) -> str:
    if model is None:
        return "the keys in the configuration reference"
    keys = [f.alias or name for name, f in model.model_fields.items()]
    if issubclass(model, CloudSettings):
        keys += [f"{name}_env" for name in model.SECRET_FIELDS]
    return ", ".join(sorted(keys))


_BUILTIN: dict[str, tuple[str, str]] = {
    "missing": ("is required", "add it"),
    "bool_type": ("expected true or false", "write true or false"),
    "bool_parsing": ("expected true or false", "write true or false"),
    "int_type": ("expected a whole number", "write a number such as 4"),
    "int_parsing": ("expected a whole number", "write a number such as 4"),
    "float_type": ("expected a number", "write a number such as 0.5"),
    "float_parsing": ("expected a number", "write a number such as 0.5"),
    "string_type": ("expected a string", "write a plain string (quote it)"),
    "dict_type": ("expected a mapping", "write it as key: value pairs"),
    "model_type": ("expected a mapping", "write it as key: value pairs"),
    "model_attributes_type": ("expected a mapping", "write it as key: value pairs"),
    "list_type": ("expected a list", "write it as a YAML list (one '- item' per line)"),
    "tuple_type": ("expected a list", "write it as a YAML list (one '- item' per line)"),
}


def describe_errors(
    err: ValidationError,
    root: type[BaseModel],
    *,
    prefix: str = "",
    sources: Mapping[tuple[Any, ...], str] | None = None,
) -> tuple[list[ConfigProblem], list[ConfigProblem]]:
    """(mistakes, things left unchecked) with key paths and fixes; no input value is ever copied here.

    ``sources`` maps the location of a value that came from an environment variable to that variable,
    so the message names where the user must fix it.
    """
    problems: list[ConfigProblem] = []
    unchecked: list[ConfigProblem] = []
    for error in err.errors():
        loc = tuple(error["loc"])
        ctx = error.get("ctx") or {}
        if error["type"] in _CUSTOM_TYPES:
            text, fix = str(ctx["problem"]), str(ctx["fix"])
            if ctx.get("key"):
                loc = (*loc[:-1], ctx["key"])
        elif error["type"] == "extra_forbidden":
            text = "unknown key"
            fix = f"remove it or use one of: {_accepted_keys(_model_at(root, loc[:-1]))} (check the spelling)"
        elif error["type"] == "literal_error":
            text, fix = "not an accepted value", f"use one of: {ctx.get('expected', '')}"
        else:
            text, fix = _BUILTIN.get(error["type"], (error["msg"], "see the configuration reference"))
        key = render_key(loc, prefix)
        variable = (sources or {}).get(loc)
        if variable is not None:
            key = f"environment variable {variable} (for {key})"
        (unchecked if error["type"] == "not_checked" else problems).append(ConfigProblem(key, text, fix))
    return problems, unchecked
