"""A config.pbtxt's text read twice: parsed with Triton's schema (``parse_config``), and walked
for the line each field is on (``Lines``), so every problem names its line; the fields newer
than the fleet's server (``newer_fields``)."""

from __future__ import annotations

from google.protobuf import text_format

from ...core.triton_schema import mc
from .tables import NEWER_FIELDS


def parse_config(text: str) -> mc.ModelConfig:
    """``text`` parsed as Triton's ModelConfig (raises ``text_format.ParseError``)."""
    return text_format.Parse(text, mc.ModelConfig())


class Lines:
    """Field path -> first line (1-based) in a text-format message that parsed cleanly.

    Paths are tuples like ``("input", 1, "dims")``: a message field carries the index of its
    occurrence (0 for a singular one), a scalar field none.
    """

    def __init__(self, text: str):
        self.map: dict[tuple, int] = {}
        try:
            self._tok = text_format.Tokenizer(text.split("\n"))
            self._message((), None)
        except (text_format.ParseError, RecursionError):
            # line numbers are a help, never a failure: the tokenizer's own error on text the
            # parser took, or nesting deeper than this walk recurses (what is mapped so far stays)
            pass

    def _next(self) -> None:
        self._tok.NextToken()

    def _record(self, path: tuple, line: int) -> None:
        self.map.setdefault(path, line)

    def _message(self, path: tuple, closer: str | None) -> None:
        tok = self._tok
        counts: dict[str, int] = {}
        while not tok.AtEnd() and tok.token != closer:
            name, line = tok.token, tok._line + 1
            self._next()
            if tok.token == ":":
                self._next()
            if tok.token in ("{", "<"):
                index = counts.get(name, 0)
                counts[name] = index + 1
                self._record(path + (name,), line)
                self._record(path + (name, index), line)
                end = "}" if tok.token == "{" else ">"
                self._next()
                self._message(path + (name, index), end)
                self._next()
            elif tok.token == "[":
                self._record(path + (name,), line)
                self._next()
                while not tok.AtEnd() and tok.token != "]":
                    if tok.token in ("{", "<"):
                        index = counts.get(name, 0)
                        counts[name] = index + 1
                        self._record(path + (name, index), tok._line + 1)
                        end = "}" if tok.token == "{" else ">"
                        self._next()
                        self._message(path + (name, index), end)
                        self._next()
                    else:
                        self._scalar()
                    if tok.token == ",":
                        self._next()
                self._next()
            else:
                self._record(path + (name,), line)
                self._scalar()
            if tok.token in (",", ";"):
                self._next()

    def _scalar(self) -> None:
        tok = self._tok
        if tok.token == "-":
            self._next()
        first = tok.token
        self._next()
        if first[:1] in ("'", '"'):
            while not tok.AtEnd() and tok.token[:1] in ("'", '"'):
                self._next()

    def line(self, *path) -> int | None:
        """The line of ``path``, else of its nearest enclosing field that is written."""
        path = tuple(path)
        while path:
            if path in self.map:
                return self.map[path]
            path = path[:-1]
        return None


def _repeated(field) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 6; label() is deprecated there
    return flag if isinstance(flag, bool) else field.label == field.LABEL_REPEATED


def newer_fields(cfg: mc.ModelConfig, lines: Lines) -> list[tuple[str, int | None]]:
    """Fields set in ``cfg`` that the fleet's tritonserver does not know."""
    found = []

    def walk(msg, path):
        for field, value in msg.ListFields():
            here = path + (field.name,)
            if NEWER_FIELDS.get(field.name) == field.containing_type.full_name:
                shown = ".".join(str(p) for p in here if not isinstance(p, int))
                found.append((shown, lines.line(*here)))
                continue
            if field.type == field.TYPE_MESSAGE:
                if field.message_type.GetOptions().map_entry:
                    if field.message_type.fields_by_name["value"].type == field.TYPE_MESSAGE:
                        for v in value.values():
                            walk(v, here)
                elif _repeated(field):
                    for i, v in enumerate(value):
                        walk(v, here + (i,))
                else:
                    walk(value, here + (0,))

    walk(cfg, ())
    return found
