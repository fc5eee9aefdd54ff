"""How a setting is declared, read and reported: the base class of every settings group (one concern's
environment variables), the declaration of one variable with its default and meaning, the parsing of durations,
and the one-sentence error that names a bad variable without showing a secret."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Optional, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic.json_schema import JsonDict


class SettingsError(ValueError):
    """An environment variable holds a value its setting cannot take; the message is one sentence naming it."""

    def __init__(self, message: str, invalid: int = 1):
        super().__init__(message)
        self.invalid = invalid  # how many variables were wrong; the message names the first


def declare(default: Any, name: str, meaning: str, *, shown: str | None = None, **bounds) -> Any:
    """A setting read from variable `name`; `shown` is the default as the README states it, when the literal
    default would mislead (a path computed at run time, "unset")."""
    extra: JsonDict | None = {"shown": shown} if shown is not None else None
    return Field(default, alias=name, description=meaning, json_schema_extra=extra, **bounds)


class SettingsGroup(BaseModel):
    """One concern's variables, built from the values of the variables by name (`from_values`; queue_db.config
    passes the environment). Empty values count as unset (the default applies); strings are stripped; the defaults
    pass the validators too. A plain pydantic model, not pydantic-settings': reading a few variables by their exact
    names needs none of its sources, whose import (asyncio, dotenv, its cloud providers) was a tenth of a light
    command's start-up."""

    model_config = ConfigDict(
        extra="ignore", frozen=True, str_strip_whitespace=True, populate_by_name=True, validate_default=True
    )
    title: ClassVar[str] = ""

    @classmethod
    def from_values(cls, values: Mapping[str, str]) -> Self:
        """The group from `values` (variable name: text, such as the environment); an empty value counts as unset."""
        return cls(**{name: values[name] for name in cls.variables() if values.get(name)})

    @classmethod
    def variables(cls) -> list[str]:
        names = []
        for field_name, info in cls.model_fields.items():
            assert info.alias is not None, f"{cls.__name__}.{field_name} has no variable (declare it with declare())"
            names.append(info.alias)
        return names


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Any) -> float:
    """Seconds in `value`: a number of seconds, or a number with a unit (s, m, h, d, w), e.g. `7d`, `36h`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        unit = _DURATION_UNITS.get(text[-1:], None) if text else None
        number = text[:-1] if unit is not None else text
        try:
            seconds = float(number) * (unit or 1)
        except ValueError:
            raise ValueError(f"must be a duration such as 7d, 12h, 90m or 3600, got {value!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"must be a duration of 0 or more, got {value!r}")
    return seconds


_EXPECTED = {
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "bool_parsing": "must be true or false",
}


def _sentence(group: type[SettingsGroup], exc: ValidationError) -> str:
    """The first error as `NAME must be …, got 'value'`: one sentence, never a secret's value."""
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else group.__name__
    secret = any(info.alias == name and "SecretStr" in repr(info.annotation) for info in group.model_fields.values())
    raw = error.get("input")
    shown = "" if secret else f", got {raw!r}"
    context = error.get("ctx") or {}
    kind = error["type"]
    if kind in _EXPECTED:
        return f"{name} {_EXPECTED[kind]}{shown}"
    for bound, words in (("ge", "at least"), ("gt", "greater than"), ("le", "at most"), ("lt", "less than")):
        if bound in context:  # the value parsed as a number, so it reads plainly: "got -1"
            limit = context[bound]
            limit = f"{limit:g}" if isinstance(limit, float) else limit
            return f"{name} must be {words} {limit}" + ("" if secret else f", got {raw}")
    if kind == "value_error":
        return f"{name} {str(context.get('error', error['msg']))}"
    return f"{name} is not valid ({error['msg']})"


def secret_value(value: Optional[SecretStr]) -> str:
    """The plain text of an optional secret setting ("" when unset), for the one call that needs it."""
    return value.get_secret_value() if value is not None else ""


def default(group: type[SettingsGroup], attribute: str) -> Any:
    """A setting's default, for code that takes the value as an argument and must agree with the variable."""
    return group.model_fields[attribute].default
