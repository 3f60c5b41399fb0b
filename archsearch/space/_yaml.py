"""YAML reading that remembers where every value came from.

Errors must name the file and line of the offending field, so the loader walks
the composed node tree itself and records the line of every key and list item
by its path (a tuple of keys and indices). It also refuses what PyYAML accepts
silently but a study file should never contain: duplicate keys, aliases
that expand into more values than any real study has (alias bombs), nesting
deeper than any real study has, and anything but a regular file (a device or
a named pipe is never read).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from archsearch.errors import SpecError
from archsearch.files import FileKindError, read_head

MAX_FILE_BYTES = 1_000_000
# A real study has a few hundred values; an alias bomb expands to billions.
MAX_VALUES = 100_000
# A real study nests keys and lists a few levels deep; PyYAML recurses per level.
MAX_DEPTH = 50

Lines = dict[tuple, int]


def read_yaml(path: str | Path) -> tuple[Any, Lines]:
    """Parse one YAML file into plain Python values and a path -> line map."""
    path = Path(path)
    text = _read_text(path)
    try:
        loader = _Loader(text, str(path))
    except yaml.YAMLError as err:  # the reader refuses control characters up front
        raise SpecError(f"not YAML text: {str(err).splitlines()[0]}", path=str(path),
                        hint="remove control characters; save the file as plain UTF-8 text") from None
    try:
        try:
            node = loader.get_single_node()
            if node is None:
                raise SpecError("the file is empty", path=str(path), hint="see `archsearch schema`")
            walker = _Walker(loader, str(path))
            return walker.value(node, ()), walker.lines
        except yaml.constructor.ConstructorError as err:
            mark = err.problem_mark or err.context_mark
            raise SpecError(f"unsupported YAML tag: {err.problem}", path=str(path),
                            line=mark.line + 1 if mark else None, hint="remove the !!tag; plain values only") from None
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            line = mark.line + 1 if mark else None
            problem = err.problem or err.context or "invalid YAML"
            raise SpecError(f"YAML syntax error: {problem}", path=str(path), line=line,
                            hint="check indentation, colons and quotes on this line") from None
        except yaml.YAMLError as err:
            raise SpecError(f"not YAML text: {str(err).splitlines()[0]}", path=str(path),
                            hint="remove control characters; save the file as plain UTF-8 text") from None
    finally:
        loader.dispose()


def read_value(text: str, *, where: str) -> Any:
    """One value written on a command line (``--set recipe.steps=50``), read as
    the same YAML a file would hold: ``[a, b]`` a list, ``50`` a number,
    ``"50"`` text. ``where`` names it in errors."""
    if len(text) > MAX_FILE_BYTES:
        raise SpecError(f"value is longer than {MAX_FILE_BYTES:,} characters", path=where)
    try:
        loader = _Loader(text, where)
    except yaml.YAMLError as err:
        raise SpecError(f"not a YAML value: {str(err).splitlines()[0]}", path=where) from None
    try:
        node = loader.get_single_node()
        return None if node is None else _Walker(loader, where).value(node, ())
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError(f"not a YAML value: {problem}", path=where,
                        hint="quote text with spaces or colons; write lists as [a, b]") from None
    finally:
        loader.dispose()


def _read_text(path: Path) -> str:
    try:
        data = read_head(path, MAX_FILE_BYTES + 1)
    except FileKindError as err:
        hint = "pass the .yaml file inside it" if "directory" in str(err) else "pass a .yaml file"
        raise SpecError(f"{err}, not a YAML file", path=str(path), hint=hint) from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(f"file is larger than {MAX_FILE_BYTES:,} bytes", path=str(path),
                        hint="a study or space file is a short YAML document")
    if b"\x00" in data:
        raise SpecError("is a binary file, not YAML", path=str(path), hint="pass a .yaml file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError("is not UTF-8 text", path=str(path), hint="save the file as UTF-8") from None


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing nesting deeper than ``MAX_DEPTH`` while it composes.

    PyYAML composes recursively, so 100,000 nested ``[`` would end in a
    RecursionError; the depth is counted here and the file refused at the
    first level too deep.
    """

    def __init__(self, stream: str, path: str):
        super().__init__(stream)
        self.path = path
        self.depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise SpecError(f"values nest deeper than {MAX_DEPTH} levels", path=self.path,
                                line=mark.line + 1, hint="a study nests a few levels of keys and lists; flatten it")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


# YAML 1.1 reads 1e9 and 3e-4 (no dot, or no exponent sign) as text; a study
# means numbers, as YAML 1.2 does, so those resolve as floats too. With that,
# a quoted number ("4") is text and the schema can refuse it.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _field(at: tuple) -> str | None:
    """A value's path as the schema's errors write it: ``seeds[1]``, ``recipe.steps``."""
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in at).lstrip(".")
    return text or None


class _Walker:
    def __init__(self, loader: yaml.SafeLoader, path: str):
        self.loader = loader
        self.path = path
        self.lines: Lines = {}
        self.count = 0
        # the mappings and lists being read, outermost first: an alias to one of them is a
        # value that contains itself (`seeds: &a [0, *a]`), endless if read on
        self.inside: list[yaml.Node] = []

    def value(self, node: yaml.Node, at: tuple) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            raise SpecError(f"expands to more than {MAX_VALUES} values", path=self.path,
                            line=node.start_mark.line + 1,
                            hint="YAML aliases nest too deeply; write the values out")
        self.lines.setdefault(at, node.start_mark.line + 1)
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            if any(node is outer for outer in self.inside):
                raise SpecError("the value contains itself (an anchor holds its own alias)", path=self.path,
                                line=self.lines[at], field=_field(at),
                                hint="a YAML alias may only repeat a value defined before it, outside it") from None
            self.inside.append(node)
            try:
                if isinstance(node, yaml.MappingNode):
                    return self._mapping(node, at)
                return [self.value(item, at + (i,)) for i, item in enumerate(node.value)]
            finally:
                self.inside.pop()
        try:
            return self.loader.construct_object(node)
        except (ValueError, OverflowError) as err:  # e.g. a date like 2020-13-45
            raise SpecError(f"cannot read value {node.value!r}: {err}", path=self.path,
                            line=node.start_mark.line + 1, field=_field(at),
                            hint="quote it to keep it as text") from None

    def _mapping(self, node: yaml.MappingNode, at: tuple) -> dict:
        self._no_self_merge(node, at)
        self.loader.flatten_mapping(node)
        out: dict = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            try:
                key = self.loader.construct_object(key_node)
            except (ValueError, OverflowError) as err:  # a key YAML reads as a date: 2020-13-45
                raise SpecError(f"cannot read key {key_node.value!r}: {err}", path=self.path, line=line,
                                field=_field(at + (key_node.value,)),
                                hint="quote it to keep it as text") from None
            if not isinstance(key, (str, int, float, bool)):
                raise SpecError("keys must be plain words", path=self.path, line=line)
            if key in out:
                raise SpecError(f"duplicate key '{key}'", path=self.path, line=line,
                                field=".".join(str(k) for k in at + (key,)),
                                hint=f"it was first set on line {self.lines[at + (key,)]}; keep one")
            self.lines[at + (key,)] = line
            out[key] = self.value(value_node, at + (key,))
        return out

    def _no_self_merge(self, node: yaml.MappingNode, at: tuple) -> None:
        """Refuse ``<<: *alias`` where the alias names this mapping or one around it: PyYAML would
        merge a mapping's keys into themselves and report each twice."""
        for key_node, value_node in node.value:
            if key_node.tag != "tag:yaml.org,2002:merge":
                continue
            merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            if any(part is outer for part in merged for outer in self.inside):
                raise SpecError("a mapping is merged into itself (<<: names an anchor around it)", path=self.path,
                                line=key_node.start_mark.line + 1, field=_field(at),
                                hint="merge only a mapping defined before and outside this one")
