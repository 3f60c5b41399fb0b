"""Load study and space files into validated models, or fail in one line.

Pydantic does the type checking; this module turns its errors into a
``SpecError`` that names the file, the line and the dotted field, with a hint
(including "did you mean" for misspelt keys and values).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from archsearch.errors import SpecError, did_you_mean
from archsearch.files import kind_problem
from archsearch.space._yaml import read_value, read_yaml
from archsearch.space.schema import Space, Study

MAX_INCLUDE_DEPTH = 8
# Included files read for one study, counted over the whole tree: ten includes
# a file nested seven deep would otherwise read ten million files.
MAX_INCLUDE_READS = 64


@dataclass(frozen=True)
class Origin:
    """Where a model was read from: its file, and the file and line of every
    field (an included file's fields keep their own file and line)."""

    path: str
    lines: dict[tuple, tuple[str, int]]
    prefix: tuple = ()  # where this model sits in its file (an inline space: ("space",))

    def where(self, loc: tuple) -> tuple[str, int | None]:
        """File and line of the deepest prefix of ``loc`` that was written."""
        loc = self.prefix + loc
        for end in range(len(loc), -1, -1):
            if loc[:end] in self.lines:
                return self.lines[loc[:end]]
        return self.path, None

    def error(self, message: str, *, loc: tuple, hint: str | None = None) -> SpecError:
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in self.prefix + loc).lstrip(".") or None
        path, line = self.where(loc)
        return SpecError(message, path=path, line=line, field=field, hint=hint)


@dataclass(frozen=True)
class Override:
    """``--set KEY=VALUE``: a dotted key of the study and a YAML value."""

    keys: tuple[str, ...]
    value: Any
    text: str

    @property
    def where(self) -> str:
        return f"--set {self.text}"


def parse_override(text: str) -> Override:
    """``recipe.steps=50`` -> Override(("recipe", "steps"), 50). Paths given
    on the command line (``data.paths``, ``data.cache_dir``, ``space``) are
    taken relative to the current folder, as a shell user means them."""
    key, sep, raw = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key.strip()):
        raise SpecError(f"--set takes KEY=VALUE with a dotted key, got {text[:80]!r}", path="--set",
                        hint="for example --set recipe.steps=50 or --set data.paths=[corpus/]")
    keys = tuple(key.strip().split("."))
    value = read_value(raw, where=f"--set {text}")
    if keys in (("data", "paths"), ("data", "cache_dir"), ("space",)):
        value = _absolute(value)
    return Override(keys, value, text)


def _absolute(value: Any) -> Any:
    if isinstance(value, str):
        return str(Path(value).expanduser().resolve())
    if isinstance(value, list):
        return [_absolute(v) for v in value]
    return value


def load_study(path: str | Path, *, overrides: Sequence[str] = ()) -> Study:
    """Read, validate and resolve a study file; its space is loaded too.

    ``overrides`` are ``KEY=VALUE`` texts (``--set``), applied on top of the
    file before anything is checked, so they are validated like the file and
    an error names the override. A ``space.`` key reaches into a space file.
    Raises ``SpecError`` naming file, line and field on any problem.
    """
    parsed = [parse_override(text) for text in overrides]
    study = _load(Study, path, overrides=parsed)
    if isinstance(study.space, str):
        space_path = Path(path).parent / study.space
        problem = kind_problem(space_path)
        if problem is not None:
            problem = "not found" if problem == "does not exist" else problem
            raise study._origin.error(f"space file '{study.space}' {problem} (looked at {space_path})",
                                      loc=("space",), hint="paths are relative to the study file; name a .yaml file")
        space = _load(Space, space_path, overrides=[Override(o.keys[1:], o.value, o.text) for o in parsed
                                                     if o.keys[0] == "space" and len(o.keys) > 1])
    else:
        space = study.space
        space._origin = Origin(study._origin.path, study._origin.lines, prefix=("space",))
    origin = study._origin
    update = {"space": space}
    if study.data.kind == "text" and study.data.paths:
        update["data"] = study.data.model_copy(update={"paths": _resolve_paths(study.data.paths, origin)})
    study = study.model_copy(update=update)
    study._origin = origin
    return study


def _resolve_paths(paths: list[str], origin: Origin) -> list[str]:
    """Data paths are relative to the study file; each must exist."""
    out = []
    for index, raw in enumerate(paths):
        path = Path(origin.path).parent / Path(raw).expanduser()
        problem = kind_problem(path, folder_ok=True)
        if problem is not None:
            raise origin.error(f"'{raw}' {problem} (looked at {path})", loc=("data", "paths", index),
                               hint="paths are relative to the study file; name text files or folders of them")
        out.append(str(path.resolve()))
    return out


def load_space(path: str | Path) -> Space:
    """Read and validate a space file."""
    return _load(Space, path)


def read_with_includes(path: str | Path, *, chain: tuple[str, ...] = (),
                       reads: list[int] | None = None) -> tuple[Any, dict]:
    """Read a YAML file; ``include:`` (a path or list, relative to the file)
    loads other files first and this file's keys override theirs, key by key.

    ``reads`` counts the included files read so far over the whole tree (at
    most ``MAX_INCLUDE_READS``); a top-level call leaves it out.
    """
    path = Path(path)
    reads = [0] if reads is None else reads
    data, lines = read_yaml(path)
    where = {loc: (str(path), line) for loc, line in lines.items()}
    if not isinstance(data, dict) or "include" not in data:
        return data, where
    origin = Origin(str(path), where)
    includes = data.pop("include")
    includes = includes if isinstance(includes, list) else [includes]
    merged, merged_where = {}, {}
    for index, name in enumerate(includes):
        loc = ("include", index) if ("include", index) in where else ("include",)
        if not isinstance(name, str):
            raise origin.error("include takes a file path or a list of them", loc=loc)
        target = path.parent / name
        problem = kind_problem(target)
        if problem is not None:
            problem = "not found" if problem == "does not exist" else problem
            raise origin.error(f"included file '{name}' {problem} (looked at {target})", loc=loc,
                               hint="paths are relative to the including file; include a .yaml file")
        target = target.resolve()
        if str(target) in chain or target == path.resolve():
            raise origin.error(f"'{name}' includes itself (through {' -> '.join(chain) or path})", loc=loc,
                               hint="remove the include cycle")
        if len(chain) >= MAX_INCLUDE_DEPTH:
            raise origin.error(f"includes nest deeper than {MAX_INCLUDE_DEPTH}", loc=loc)
        reads[0] += 1
        if reads[0] > MAX_INCLUDE_READS:
            raise origin.error(f"the includes read more than {MAX_INCLUDE_READS} files (limit {MAX_INCLUDE_READS})",
                               loc=loc, hint="include each shared file once, from one base file")
        base, base_where = read_with_includes(target, chain=chain + (str(path.resolve()),), reads=reads)
        if not isinstance(base, dict):
            raise origin.error(f"included file '{name}' is not a mapping of keys", loc=loc)
        merged = _merge(merged, base)
        merged_where.update(base_where)
    merged = _merge(merged, data)
    merged_where.update({loc: w for loc, w in where.items() if loc[:1] != ("include",)})
    return merged, merged_where


def _apply(data: dict, lines: dict, override: Override) -> None:
    """Set ``override`` into the read tree; every path under it now points at the override."""
    node = data
    for depth, key in enumerate(override.keys[:-1]):
        if not isinstance(node.get(key), dict):
            if key in node and node[key] is not None:
                raise SpecError(f"'{'.'.join(override.keys[:depth + 1])}' is not a section, so "
                                f"'{'.'.join(override.keys)}' cannot be set", path=override.where)
            node[key] = {}
        node = node[key]
    node[override.keys[-1]] = override.value
    for loc in [loc for loc in lines if loc[:len(override.keys)] == override.keys]:
        del lines[loc]
    lines[override.keys] = (override.where, None)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _load(model: type[BaseModel], path: str | Path, *, overrides: Sequence[Override] = ()) -> Any:
    data, lines = read_with_includes(path)
    origin = Origin(str(path), lines)
    if not isinstance(data, dict):
        raise origin.error(f"expected a mapping of keys at the top, got {type(data).__name__}",
                           loc=(), hint="see `archsearch schema` for the expected keys")
    for override in overrides:
        if override.keys[0] == "space" and len(override.keys) > 1 and isinstance(data.get("space"), str):
            continue  # a key of the space file: applied when that file is read
        _apply(data, lines, override)
    try:
        value = model.model_validate(data)
    except ValidationError as err:
        raise _translate(err, model, data, origin) from None
    value._origin = origin
    return value


def _translate(err: ValidationError, model: type[BaseModel], data: dict, origin: Origin) -> SpecError:
    # Unions report one error per branch; the branch that got deepest into
    # the user's data is the one they meant.
    errors = [(e, *_clean_loc(e, data)) for e in err.errors(include_url=False)]
    first, loc, _ = max(errors, key=lambda item: item[2])
    kind, message = first["type"], first["msg"]
    hint = None
    if kind == "extra_forbidden":
        allowed = _fields_at(model, loc[:-1])
        message = f"unknown key '{loc[-1]}'"
        hint = did_you_mean(loc[-1], allowed) or (f"allowed: {', '.join(allowed)}" if allowed else None)
    elif kind == "missing":
        message = "required key is missing"
        hint = f"add '{loc[-1]}:' here"
    elif kind == "literal_error":
        expected = first["ctx"]["expected"]
        hint = did_you_mean(first["input"], _quoted(expected)) or f"expected {expected}"
        message = f"unknown value {first['input']!r}"
    elif kind == "union_tag_invalid":
        expected, loc = first["ctx"]["expected_tags"], loc + ("kind",)
        hint = did_you_mean(first["ctx"]["tag"], _quoted(expected)) or f"expected one of {expected}"
        message = f"unknown kind {first['ctx']['tag']!r}"
    elif kind == "union_tag_not_found":
        message = "missing 'kind'"
        hint = f"add kind: one of {first.get('ctx', {}).get('expected_tags', '')}"
    elif kind in ("int_type", "float_type", "bool_type", "int_from_float"):
        hint = _type_hint(kind, first.get("input"))
    elif kind == "value_error":  # the schema's own checks say what to do in their message
        message = message.removeprefix("Value error, ")
    else:
        hint = "see `archsearch schema` for the expected types"
    return origin.error(message, loc=loc, hint=hint)


def _type_hint(kind: str, value: Any) -> str:
    """What to write instead: numbers and booleans are never converted from text (or each other)."""
    if isinstance(value, str):
        if kind == "bool_type":
            return "write true or false without quotes" if value.lower() in ("true", "false") else "write true or false"
        try:
            float(value.replace("_", ""))
        except ValueError:
            return "give a number"
        return "write the number without quotes"
    if kind != "bool_type" and isinstance(value, float):
        return f"write a whole number such as {int(value)}" if value.is_integer() else "write a whole number"
    if kind == "bool_type":
        return "write true or false"
    return "see `archsearch schema` for the expected types"


def _clean_loc(error: dict, data: Any) -> tuple[tuple, int]:
    """The error's path through the user's data, and how many parts matched.

    Pydantic puts union branch names (``str``, ``Space``, ``text``) into the
    path; those are dropped. A missing key is kept as the last part.
    """
    out, node, depth = [], data, 0
    loc = error["loc"]
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        elif i == len(loc) - 1 and error["type"] == "missing":
            out.append(part)
            break
        else:
            continue
        out.append(part)
        depth += 1
    return tuple(out), depth


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        sub = _model_of(field.annotation) if field else None
        if sub is None:
            return []
        model = sub
    return list(model.model_fields)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _quoted(expected: str) -> list[str]:
    return [part.strip(" '") for part in expected.replace(" or ", ",").split(",") if part.strip(" '")]
