"""The suite's JSON Schema, and a validator for the part of JSON Schema it uses.

The schema file is the one statement of the suite format's shape: editors read it, and
``validate`` checks a suite against it here (keywords: type, enum, properties, required,
additionalProperties, items, minItems, minProperties, minLength, minimum,
exclusiveMinimum, pattern, allOf, local $ref). A keyword outside that list is an error,
so the file cannot state a rule that the loader would not enforce.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any

SUPPORTED = frozenset(
    {
        "$schema", "$id", "$defs", "$ref", "title", "description",
        "type", "enum", "properties", "required", "additionalProperties", "items",
        "minItems", "minProperties", "minLength", "minimum", "exclusiveMinimum", "pattern",
        "allOf",
    }
)  # fmt: skip

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}

Path = tuple[str | int, ...]


@cache
def suite_schema() -> dict[str, Any]:
    text = resources.files("slotune.regress").joinpath("suite.schema.json").read_text()
    return json.loads(text)


def validate(value: Any, schema: dict[str, Any] | None = None) -> list[tuple[Path, str]]:
    """Every violation as (path to the value, problem); empty when ``value`` conforms."""
    root = schema if schema is not None else suite_schema()
    return list(_check(value, root, root, ()))


def _check(value: Any, schema: dict[str, Any], root: dict[str, Any], path: Path) -> Iterator:
    unknown = set(schema) - SUPPORTED
    if unknown:
        raise ValueError(f"schema keyword(s) {sorted(unknown)} are not supported")
    if "$ref" in schema:
        yield from _check(value, _resolve(root, schema["$ref"]), root, path)
    for sub in schema.get("allOf", ()):
        yield from _check(value, sub, root, path)
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_is(value, t) for t in names):
            yield path, f"must be {' or '.join(_article(t) for t in names)}, not {_describe(value)}"
            return
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(json.dumps(c) for c in schema["enum"])
        yield path, f"must be one of {choices}, not {json.dumps(value, default=str)}"
        return
    if isinstance(value, dict):
        yield from _check_object(value, schema, root, path)
    elif isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            yield path, f"needs at least {schema['minItems']} item(s)"
        if "items" in schema:
            for i, item in enumerate(value):
                yield from _check(item, schema["items"], root, (*path, i))
    elif isinstance(value, str):
        yield from _check_string(value, schema, path)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield from _check_number(value, schema, path)


def _check_object(
    value: dict, schema: dict[str, Any], root: dict[str, Any], path: Path
) -> Iterator:
    for key in schema.get("required", ()):
        if key not in value:
            yield (*path, key), "is required"
    if len(value) < schema.get("minProperties", 0):
        yield path, f"needs at least {schema['minProperties']} entry(ies)"
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in props:
            yield from _check(item, props[key], root, (*path, key))
        elif extra is False:
            known = ", ".join(sorted(props))
            yield (*path, key), f"is not a known key (known: {known})"
        elif isinstance(extra, dict):
            yield from _check(item, extra, root, (*path, key))


def _check_string(value: str, schema: dict[str, Any], path: Path) -> Iterator:
    if len(value) < schema.get("minLength", 0):
        yield path, "must not be empty"
    pattern = schema.get("pattern")
    if pattern is not None and not re.search(pattern, value):
        expected = schema.get("description", f"the pattern {pattern}")
        yield path, f"{value!r} is not valid; expected {expected}"


def _check_number(value: float, schema: dict[str, Any], path: Path) -> Iterator:
    if "minimum" in schema and value < schema["minimum"]:
        yield path, f"must be at least {schema['minimum']} (got {value})"
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        yield path, f"must be greater than {schema['exclusiveMinimum']} (got {value})"


def _resolve(root: dict[str, Any], ref: str) -> dict[str, Any]:
    if not ref.startswith("#/"):
        raise ValueError(f"schema: only local $ref are supported (got {ref!r})")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _is(value: Any, type_name: str) -> bool:
    if isinstance(value, bool) and type_name not in ("boolean",):
        return False
    return isinstance(value, _TYPES[type_name])


def _article(type_name: str) -> str:
    return {"object": "a mapping", "array": "a list", "integer": "an integer"}.get(
        type_name, f"a {type_name}"
    )


def _describe(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return f"{value} (a boolean)".lower()
    for name in ("object", "array", "string", "integer", "number"):
        if _is(value, name):
            return f"{_article(name)} ({json.dumps(value, default=str)[:40]})"
    return type(value).__name__
