"""YAML reading that remembers where every value came from.

Errors must name the file and line of the offending field, so the loader walks
the composed node tree itself and records the line of every key and list item
by its path (a tuple of keys and indices). It also refuses what PyYAML accepts
silently but a study file should never contain: duplicate keys, and aliases
that expand into more values than any real study has (alias bombs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from archsearch.errors import SpecError

MAX_FILE_BYTES = 1_000_000
# A real study has a few hundred values; an alias bomb expands to billions.
MAX_VALUES = 100_000

Lines = dict[tuple, int]


def read_yaml(path: str | Path) -> tuple[Any, Lines]:
    """Parse one YAML file into plain Python values and a path -> line map."""
    path = Path(path)
    text = _read_text(path)
    try:
        loader = yaml.SafeLoader(text)
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


def _read_text(path: Path) -> str:
    if not path.exists():
        raise SpecError("no such file", path=str(path), hint="check the path")
    if path.is_dir():
        raise SpecError("is a directory, not a YAML file", path=str(path),
                        hint="pass the .yaml file inside it")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise SpecError(f"file is larger than {MAX_FILE_BYTES} bytes", path=str(path),
                        hint="a study or space file is a short YAML document")
    data = path.read_bytes()
    if b"\x00" in data:
        raise SpecError("is a binary file, not YAML", path=str(path), hint="pass a .yaml file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError("is not UTF-8 text", path=str(path), hint="save the file as UTF-8") from None


class _Walker:
    def __init__(self, loader: yaml.SafeLoader, path: str):
        self.loader = loader
        self.path = path
        self.lines: Lines = {}
        self.count = 0

    def value(self, node: yaml.Node, at: tuple) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            raise SpecError(f"expands to more than {MAX_VALUES} values", path=self.path,
                            line=node.start_mark.line + 1,
                            hint="YAML aliases nest too deeply; write the values out")
        self.lines.setdefault(at, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, at)
        if isinstance(node, yaml.SequenceNode):
            return [self.value(item, at + (i,)) for i, item in enumerate(node.value)]
        try:
            return self.loader.construct_object(node)
        except (ValueError, OverflowError) as err:  # e.g. a date like 2020-13-45
            raise SpecError(f"cannot read value {node.value!r}: {err}", path=self.path,
                            line=node.start_mark.line + 1, field=".".join(map(str, at)) or None,
                            hint="quote it to keep it as text") from None

    def _mapping(self, node: yaml.MappingNode, at: tuple) -> dict:
        self.loader.flatten_mapping(node)
        out: dict = {}
        for key_node, value_node in node.value:
            key = self.loader.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if not isinstance(key, (str, int, float, bool)):
                raise SpecError("keys must be plain words", path=self.path, line=line)
            if key in out:
                raise SpecError(f"duplicate key '{key}'", path=self.path, line=line,
                                field=".".join(str(k) for k in at + (key,)),
                                hint=f"it was first set on line {self.lines[at + (key,)]}; keep one")
            self.lines[at + (key,)] = line
            out[key] = self.value(value_node, at + (key,))
        return out
