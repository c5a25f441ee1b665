"""Reading a spec document — YAML, or JSON (which YAML includes) — into plain data, with bounds.

A study spec is a few hundred values nested a few levels deep, so a document far beyond that is
refused before it costs anything: nesting deeper than `MAX_DEPTH` is refused while it is being read
(before Python's recursion limit is near), and so is a document whose values or text, counted with
every alias expanded where it is used, exceed `MAX_VALUES` or `MAX_CHARACTERS` ("billion laughs" is
refused after a few dozen values). An alias to a collection that contains it, a key given twice in a
mapping (merge keys `<<` excepted), an integer written with more than `MAX_INTEGER_TEXT` characters
(Python refuses to read more than 4,300 digits) and the tags that make dates, bytes, sets and pairs are refused
too, each with its line. Everything refused is a `DocumentError` listing `(path, message, line)`
problems; nothing else leaves `load_document`.

YAML 1.1 reads `1e-05` as a string; JSON (and YAML 1.2) mean a number, so such numbers are floats here.
libyaml (C) parses the text; documents with JSON's surrogate-pair escapes (`"\\ud83d\\ude00"`), which
libyaml refuses, are parsed by PyYAML's Python parser, and each pair becomes its character.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml._yaml import CParser
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

MAX_DEPTH = 20
"""Collections nested in one another; a spec needs 5."""
MAX_VALUES = 5_000
"""Values (scalars and collections) with aliases expanded; the largest shipped spec has 186."""
MAX_CHARACTERS = 1_000_000
"""Characters of all scalars with aliases expanded (a long text repeated by aliases costs what its copies would)."""
MAX_INTEGER_TEXT = 100
"""Characters of an integer; Python refuses to convert more than 4,300 digits, and a spec stores 32-bit integers."""

Path = tuple[str, ...]
Problem = tuple[Path, str, int | None]

MERGE_TAG = "tag:yaml.org,2002:merge"
_REFUSED_TAGS = ("binary", "timestamp", "omap", "pairs", "set")  # not JSON values; a spec never needs them
_JSON_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+$")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")


class DocumentError(ValueError):
    """A document that cannot be read; `problems` lists (key path, message, 1-based line or None)."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(message for _, message, _ in problems))


class _LimitError(yaml.MarkedYAMLError):
    """A bound of this loader, located in the text like PyYAML's own errors."""


class _SpecResolver(Resolver):
    """YAML 1.1's implicit types without timestamps (dates stay text), plus JSON's exponent floats."""

    yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in Resolver.yaml_implicit_resolvers.items()
    }


_SpecResolver.add_implicit_resolver("tag:yaml.org,2002:float", _JSON_EXPONENT_FLOAT, list("-+0123456789"))


class _BoundedComposer(Composer):
    """PyYAML's composer, counting depth and expanded values as it goes and refusing recursive aliases."""

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0
        self._values = 0
        self._characters = 0
        self._expanded: dict[int, tuple[int, int]] = {}  # id(node) -> (values, characters) under it, aliases expanded

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            target = self.anchors.get(event.anchor)
            if target is not None and id(target) not in self._expanded:
                raise _LimitError("while composing", target.start_mark,
                                  f"the alias *{event.anchor} refers to a collection that contains it",
                                  event.start_mark)
            node = super().compose_node(parent, index)
            self._count(*self._expanded[id(node)], event)
            return node
        collection = isinstance(event, SequenceStartEvent | MappingStartEvent)
        if collection and self._depth >= MAX_DEPTH:
            raise _LimitError(None, None, f"nested deeper than {MAX_DEPTH} levels; a spec needs at most 5",
                              event.start_mark)
        before = self._values, self._characters
        self._count(1, 0 if collection else len(event.value), event)
        self._depth += collection
        node = super().compose_node(parent, index)
        self._depth -= collection
        self._expanded[id(node)] = (self._values - before[0], self._characters - before[1])
        return node

    def _count(self, values: int, characters: int, event: Any) -> None:
        self._values += values
        self._characters += characters
        for total, bound, what in ((self._values, MAX_VALUES, "values"),
                                   (self._characters, MAX_CHARACTERS, "characters of text")):
            if total > bound:
                raise _LimitError(None, None, f"the document holds more than {bound:,} {what} (an alias counts "
                                              f"what it repeats each time it is used)", event.start_mark)


class _SpecConstructor(SafeConstructor):
    """Safe construction of JSON-like values; any failure to build a value is located at its node."""

    yaml_constructors = {tag: constructor for tag, constructor in SafeConstructor.yaml_constructors.items()
                         if tag not in {f"tag:yaml.org,2002:{name}" for name in _REFUSED_TAGS}}

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.MarkedYAMLError:
            raise
        except Exception as error:  # e.g. int() of 5,000 digits, !!bool on "maybe"
            raise ConstructorError(None, None, f"cannot read this {node.tag.rsplit(':', 1)[-1]} value: "
                                               f"{type(error).__name__}: {error}", node.start_mark) from error

    def construct_yaml_int(self, node: ScalarNode) -> int:
        if len(node.value) > MAX_INTEGER_TEXT:
            raise ConstructorError(None, None, f"an integer written with {len(node.value):,} characters; allowed: "
                                               f"at most {MAX_INTEGER_TEXT}", node.start_mark)
        return super().construct_yaml_int(node)

    def construct_yaml_str(self, node: ScalarNode) -> str:
        text = super().construct_yaml_str(node)
        try:  # JSON writes characters beyond U+FFFF as two escaped surrogates; join each pair
            return text.encode("utf-16", "surrogatepass").decode("utf-16")
        except UnicodeDecodeError as error:
            raise ConstructorError(None, None, "a lone surrogate escape is not a character", node.start_mark) \
                from error


_SpecConstructor.add_constructor("tag:yaml.org,2002:int", _SpecConstructor.construct_yaml_int)
_SpecConstructor.add_constructor("tag:yaml.org,2002:str", _SpecConstructor.construct_yaml_str)


class _FastLoader(_BoundedComposer, CParser, _SpecConstructor, _SpecResolver):
    def __init__(self, text: str) -> None:
        CParser.__init__(self, text)
        _SpecConstructor.__init__(self)
        _SpecResolver.__init__(self)
        _BoundedComposer.__init__(self)


class _PythonLoader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, _BoundedComposer, _SpecConstructor,
                    _SpecResolver):
    def __init__(self, text: str) -> None:
        yaml.reader.Reader.__init__(self, text)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        _BoundedComposer.__init__(self)
        _SpecConstructor.__init__(self)
        _SpecResolver.__init__(self)


def load_document(text: str) -> tuple[Any, dict[Path, int]]:
    """The data of a one-document YAML/JSON text and the 1-based line of each key path in it."""
    loader_class = _PythonLoader if _SURROGATE_ESCAPE.search(text) else _FastLoader
    try:
        loader = loader_class(text)
        try:
            root = loader.get_single_node()
            if root is None:
                return None, {}
            lines: dict[Path, int] = {}
            duplicates: list[Problem] = []
            _index(loader, root, (), lines, duplicates, set())
            if duplicates:
                raise DocumentError(duplicates)
            return loader.construct_document(root), lines
        finally:
            loader.dispose()
    except (_LimitError, ConstructorError) as error:  # well-formed, but not what a spec can hold
        raise DocumentError([((), error.problem, error.problem_mark.line + 1)]) from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        raise DocumentError([((), f"not valid YAML/JSON: {error}", mark.line + 1 if mark else None)]) from error
    except UnicodeError as error:  # text that is no Unicode (lone surrogates from a Python caller)
        raise DocumentError([((), f"not valid YAML/JSON: {error}", None)]) from error


def _index(loader: _SpecConstructor, node: Node, path: Path, lines: dict[Path, int], duplicates: list[Problem],
           checked: set[int]) -> None:
    """Record the line of each key path (a key's own line wins) and the keys given twice in one mapping."""
    lines[path] = node.start_mark.line + 1
    if isinstance(node, SequenceNode):
        for position, item in enumerate(node.value):
            _index(loader, item, (*path, str(position)), lines, duplicates, checked)
    elif isinstance(node, MappingNode):
        first_check = id(node) not in checked
        checked.add(id(node))
        first_lines: dict[Any, int] = {}
        for key, value in node.value:
            if key.tag == MERGE_TAG:  # merged keys may be overridden here; not duplicates
                continue
            child = (*path, str(key.value))
            _index(loader, value, child, lines, duplicates, checked)
            lines[child] = key.start_mark.line + 1
            if first_check and isinstance(key, ScalarNode):
                constructed = loader.construct_object(key)
                if constructed in first_lines:
                    duplicates.append((child, f"the key {shown(key.value)} is given twice in this mapping (first "
                                              f"on line {first_lines[constructed]}); give it once", lines[child]))
                else:
                    first_lines[constructed] = lines[child]


def shown(value: Any, limit: int = 60) -> str:
    """`repr(value)` cut to about `limit` characters, for messages that echo what was given."""
    if isinstance(value, int) and value.bit_length() > 4 * limit:  # the repr of a huge integer is slow, or refused
        return f"an integer of {value.bit_length():,} bits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
