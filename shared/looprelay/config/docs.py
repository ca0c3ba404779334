"""Generate the JSON Schema and the Markdown reference from the config models.

Both are checked in (``schema/config.schema.json``, ``docs/config.md``) and tests keep them
equal to what these functions produce, so the models stay the single list of options.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from looprelay.config.model import Config

_DOCS_HEADER = """# Configuration reference

looprelay reads one YAML file (`--config FILE`, or `LOOPRELAY_CONFIG` for the Cloud Functions).
Every key is optional; an unknown key is an error that names it. Secrets are never written
here: keys ending in `Env` or `webhookSecrets` hold the *names* of environment variables.
After the file, environment variables `LOOPRELAY__<section>__<key>=<YAML value>` override single
keys (for example `LOOPRELAY__store__backend=firestore`).

Generated from `shared/looprelay/config/model.py` by `looprelay config docs`; a test keeps it equal.
"""


def config_schema() -> dict[str, Any]:
    """Return the JSON Schema of the config file (keys as written in YAML)."""
    schema = Config.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "looprelay configuration"
    return schema


def config_schema_text() -> str:
    """Return the schema as the exact text checked in under ``schema/``."""
    return json.dumps(config_schema(), indent=2, sort_keys=True) + "\n"


def config_docs() -> str:
    """Return ``docs/config.md``: one table row per key with type, default and meaning."""
    lines = [_DOCS_HEADER]
    for section, rows in _sections(Config, prefix=""):
        lines.append(f"## `{section}`\n")
        doc = (rows[0][3] if rows else "") or ""
        if doc:
            lines.append(doc + "\n")
        lines.append("| key | type | default | meaning |")
        lines.append("| --- | --- | --- | --- |")
        for key, type_text, default, _, meaning in rows[1:]:
            lines.append(f"| `{key}` | {type_text} | {default} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


def documented_keys() -> list[str]:
    """Return every leaf key as a dotted YAML path, e.g. ``github.webhookSecrets``."""
    keys: list[str] = []
    for _, rows in _sections(Config, prefix=""):
        keys.extend(row[0] for row in rows[1:])
    return keys


_Row = tuple[str, str, str, str, str]
_DEFAULT_TEXT_CAP = 200


def _sections(model: type[BaseModel], *, prefix: str) -> Iterator[tuple[str, list[_Row]]]:
    leaves: list[_Row] = [("", "", "", (model.__doc__ or "").strip(), "")]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        section = _section_model(field.annotation)
        if section is not None and typing.get_origin(field.annotation) is list:
            # A list of objects is a key of its own, and its items are documented below it.
            leaves.append(
                (
                    key,
                    f"list of `{key}[]` objects",
                    _default_text(field),
                    "",
                    (field.description or "").replace("|", "\\|"),
                )
            )
            nested.append((key + "[]", section))
            continue
        if section is not None:
            nested.append((key, section))
            continue
        leaves.append(
            (
                key,
                _declared_enum(field) or _type_text(field.annotation),
                _default_text(field),
                "",
                (field.description or "").replace("|", "\\|"),
            )
        )
    if prefix and len(leaves) > 1:
        yield prefix.rstrip("."), leaves
    for key, section in nested:
        yield from _sections(section, prefix=key + ".")


def _declared_enum(field: Any) -> str:
    """The values a field's schema declares, for a key resolved leniently at run time."""
    extra = field.json_schema_extra
    values = extra.get("enum") if isinstance(extra, dict) else None
    return " \\| ".join(f"`{value}`" for value in values) if isinstance(values, list) else ""


def _section_model(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _type_text(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{value}`" for value in typing.get_args(annotation))
    if origin in (types.UnionType, typing.Union):
        return " \\| ".join(_type_text(arg) for arg in typing.get_args(annotation))
    if origin is list:
        return f"list of {_type_text(typing.get_args(annotation)[0])}"
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _default_text(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    text = json.dumps(value, default=lambda model: model.model_dump(by_alias=True))
    return f"`{text}`" if len(text) <= _DEFAULT_TEXT_CAP else "see meaning"
