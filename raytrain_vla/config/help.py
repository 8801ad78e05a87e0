"""`--help` for the commands that take config overrides: every key, its type, default and meaning.

The meaning is the schema's own comment on the field (above it or inline), read by draccus's
docstring reader, so the help cannot drift from `schema.py`; a test requires every key to have one.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import textwrap
import types
import typing
from typing import Any

from draccus.wrappers.docstring import get_attribute_docstring

from raytrain_vla.config.keys import field_types
from raytrain_vla.config.schema import Config


@dataclasses.dataclass(frozen=True)
class KeyHelp:
    key: str
    type_name: str
    default: str
    meaning: str


def _type_name(tp: Any) -> str:
    """`int`, `list[str]`, `one of: fp32, bf16`, `int | [min, max]` in the user's terms."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return "{" + ",".join(str(a) for a in args) + "}"
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin in (list, tuple, dict):
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{origin.__name__}[{inner}]"
    if dataclasses.is_dataclass(tp):
        return "{" + ", ".join(field_types(tp)) + "}"
    return getattr(tp, "__name__", str(tp))


def _meaning(cls: type, name: str) -> str:
    """The inline comment, else the comment block above (which may head several fields)."""
    doc = get_attribute_docstring(cls, name)
    return " ".join((doc.comment_inline.strip() or doc.comment_above).split())


def _default_text(value: Any) -> str:
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
        value = [dataclasses.asdict(v) for v in value]
    if isinstance(value, tuple):
        value = list(value)
    text = json.dumps(value, default=str)
    return text if len(text) <= 200 else text[:197] + "..."


def key_help(cls: type = Config, prefix: str = "", instance: Any = None) -> list[KeyHelp]:
    """Every leaf key of the schema: a section's own keys first, then its subsections'."""
    instance = cls() if instance is None else instance
    rows: list[KeyHelp] = []
    nested: list[KeyHelp] = []
    for name, tp in field_types(cls).items():
        key = f"{prefix}{name}"
        value = getattr(instance, name)
        if dataclasses.is_dataclass(tp):
            nested.extend(key_help(tp, key + ".", value))
        else:
            rows.append(KeyHelp(key, _type_name(tp), _default_text(value), _meaning(cls, name)))
    return rows + nested


def section_docs(cls: type = Config, prefix: str = "") -> dict[str, str]:
    """Each section's class docstring (its first paragraph), by dotted section name."""
    out: dict[str, str] = {}
    for name, tp in field_types(cls).items():
        if dataclasses.is_dataclass(tp):
            doc = (tp.__doc__ or "").strip()
            if doc and not doc.startswith(tp.__name__ + "("):  # not dataclass's generated one
                out[prefix + name] = " ".join(doc.split("\n\n")[0].split())
            out.update(section_docs(tp, f"{prefix}{name}."))
    return out


def format_config_help(usage: str, description: str, extra_options: list[tuple[str, str]]) -> str:
    """The full help text: usage, the command's own options, then one entry per config key.

    Each key's line starts with `--`, so `--help | grep -c '^ *--'` counts the options."""
    width = min(shutil.get_terminal_size((100, 20)).columns, 120)
    wrap = textwrap.TextWrapper(width=width, initial_indent=" " * 8, subsequent_indent=" " * 8)
    lines = [f"usage: {usage}", "", description.strip(), "", "options:", "  -h, --help"]
    lines.append(wrap.fill("show this help (every config key, its type, default and meaning)"))
    lines.append("  --config PATH")
    lines.append(wrap.fill("a YAML file over the packaged default; --KEY=VALUE overrides win"))
    for flag, meaning in extra_options:
        lines.append(f"  {flag}")
        lines.append(wrap.fill(meaning))
    lines += ["", "config keys (--KEY=VALUE; values are YAML, e.g. --ray.num_workers='[2,4]'):"]
    sections = section_docs()
    current = None
    for row in key_help():
        section = row.key.rsplit(".", 1)[0]
        if section != current:
            current = section
            lines += ["", f"[{section}]" + (f" {sections[section]}" if section in sections else "")]
        lines.append(f"  --{row.key} {row.type_name} (default: {row.default})")
        lines.append(wrap.fill(row.meaning))
    return "\n".join(lines) + "\n"


def wants_help(argv: list[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in argv)
