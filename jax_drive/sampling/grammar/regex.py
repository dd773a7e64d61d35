"""The regular-expression subset every grammar goes through: parse once, write it for each
consumer (outlines-core's compiler, Python's ``re``, llama.cpp's GBNF).

Supported (the syntax shared by Rust's ``regex`` crate, which outlines-core compiles, and
Python's ``re``): literals and ``\\``-escaped punctuation; ``\\n \\t \\r \\f \\v``;
``\\xHH``, ``\\x{H..}``, ``\\uHHHH``, ``\\u{H..}``, ``\\UHHHHHHHH``; ``.`` (any character but
``\\n``); character classes ``[...]`` / ``[^...]`` with ranges; the shorthands ``\\d \\w \\s``
(and ``\\D \\W \\S``) with their ASCII meaning (``[0-9]``, ``[0-9A-Za-z_]``,
``[\\t\\n\\v\\f\\r ]``) everywhere, locally and on every server; groups ``(...)``, ``(?:...)``,
``(?P<name>...)``; alternation; the quantifiers ``* + ? {m} {m,} {m,n}`` (a lazy ``?`` after
one changes nothing for a whole-string match and is accepted). A leading ``^`` and a trailing
``$`` are dropped: a grammar always matches the whole answer. :func:`normalize` also removes
the NUL character from every class: no grammar produces it.

Refused with a :class:`RegexError` naming the construct: look-around, back-references, word
boundaries and other anchors, inline flags, Unicode property classes, nested classes and class
set operations.

A parsed expression is a tree of :class:`Chars` (a set of code points), :class:`Concat`,
:class:`Alt` and :class:`Repeat`.
"""

from __future__ import annotations

import dataclasses

MAX_CODE_POINT = 0x10FFFF
Ranges = tuple[tuple[int, int], ...]


class GrammarError(ValueError):
    """A grammar that cannot be used: bad syntax, unsupported features, a dead end, too many
    states, no way to finish within the token budget, or a construct a server dialect lacks."""


class RegexError(GrammarError):
    """A regex outside the supported subset (the message names the construct and offset)."""


@dataclasses.dataclass(frozen=True)
class Chars:
    """One character from a set: ``ranges`` (sorted, disjoint, inclusive code-point ranges),
    or, when ``negated``, any character outside them."""

    ranges: Ranges
    negated: bool = False

    @property
    def literal(self) -> str | None:
        """The character when the set is a single one, else None."""
        if not self.negated and len(self.ranges) == 1 and self.ranges[0][0] == self.ranges[0][1]:
            return chr(self.ranges[0][0])
        return None


@dataclasses.dataclass(frozen=True)
class Concat:
    items: tuple = ()


@dataclasses.dataclass(frozen=True)
class Alt:
    options: tuple


@dataclasses.dataclass(frozen=True)
class Repeat:
    item: object
    lo: int
    hi: int | None  # None: unbounded


def _merge(ranges) -> Ranges:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _complement(ranges: Ranges) -> Ranges:
    out, nxt = [], 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return tuple(out)


_DIGIT = ((48, 57),)
_WORD = _merge([(48, 57), (65, 90), (95, 95), (97, 122)])
_SPACE = _merge([(9, 13), (32, 32)])
SHORTHANDS = {"d": (_DIGIT, False), "D": (_DIGIT, True), "w": (_WORD, False), "W": (_WORD, True),
              "s": (_SPACE, False), "S": (_SPACE, True)}
_CONTROL = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
_REFUSED = {"b": "word boundary \\b", "B": "word boundary \\B", "A": "anchor \\A", "z": "anchor \\z",
            "Z": "anchor \\Z", "G": "anchor \\G", "p": "Unicode class \\p", "P": "Unicode class \\P",
            "k": "back-reference \\k", "K": "\\K"}


class _Parser:
    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def error(self, what: str) -> RegexError:
        return RegexError(f"{what} at offset {self.pos} of regex {self.text!r}")

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.text[i] if i < len(self.text) else ""

    def take(self) -> str:
        ch = self.peek()
        self.pos += 1
        return ch

    def alternation(self):
        options = [self.concat()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.concat())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def concat(self):
        items = []
        while self.peek() not in ("", "|", ")"):
            items.append(self.quantified())
        return items[0] if len(items) == 1 else Concat(tuple(items))

    def quantified(self):
        node = self.atom()
        while True:
            ch = self.peek()
            if ch and ch in "*+?":
                self.pos += 1
                node = Repeat(node, 0 if ch != "+" else 1, 1 if ch == "?" else None)
            elif ch == "{":
                node = Repeat(node, *self.bounds())
            else:
                return node
            if self.peek() == "?":  # lazy: the same whole-string language
                self.pos += 1

    def bounds(self) -> tuple[int, int | None]:
        end = self.text.find("}", self.pos)
        body = self.text[self.pos + 1:end] if end > 0 else ""
        lo, sep, hi = body.partition(",")
        if not lo.strip().isdigit() or (hi.strip() and not hi.strip().isdigit()):
            raise self.error("a '{' must start a repetition {m}, {m,} or {m,n} (write \\{ for the brace)")
        self.pos = end + 1
        lo_n = int(lo)
        hi_n = lo_n if not sep else (int(hi) if hi.strip() else None)
        if hi_n is not None and hi_n < lo_n:
            raise self.error(f"repetition {{{body}}} has max < min")
        return lo_n, hi_n

    def atom(self):
        ch = self.peek()
        if ch == "(":
            return self.group()
        if ch == "[":
            return self.char_class()
        if ch == ".":
            self.pos += 1
            return Chars(((10, 10),), negated=True)
        if ch == "\\":
            value = self.escape()
            return value if isinstance(value, Chars) else Chars(((value, value),))
        if ch and ch in "*+?{":
            raise self.error(f"nothing to repeat before {ch!r}")
        if ch and ch in "^$":
            raise self.error(f"anchor {ch!r} inside the expression (only a leading ^ and trailing $ are allowed)")
        self.pos += 1
        return Chars(((ord(ch), ord(ch)),))

    def group(self):
        self.pos += 1
        if self.peek() == "?":
            rest = self.text[self.pos:self.pos + 3]
            if rest.startswith("?:"):
                self.pos += 2
            elif rest.startswith("?P<") or (rest.startswith("?<") and rest[2:3] not in ("=", "!")):
                end = self.text.find(">", self.pos)
                if end < 0:
                    raise self.error("unterminated group name")
                self.pos = end + 1
            else:
                raise self.error("look-around, inline flags and other (?...) groups are not supported")
        node = self.alternation()
        if self.take() != ")":
            raise self.error("missing ')'")
        return node

    def hex_escape(self, width: int) -> int:
        if self.peek() == "{":
            end = self.text.find("}", self.pos)
            digits = self.text[self.pos + 1:end] if end > 0 else ""
            self.pos = end + 1
        else:
            digits = self.text[self.pos:self.pos + width]
            self.pos += width
            if len(digits) != width:
                digits = ""
        try:
            value = int(digits, 16)
        except ValueError:
            raise self.error("malformed hex escape") from None
        if value > MAX_CODE_POINT or 0xD800 <= value <= 0xDFFF:
            raise self.error(f"escape \\x{{{digits}}} is not a Unicode scalar value")
        return value

    def escape(self) -> "int | Chars":
        """At a backslash: the escaped code point, or the class of a shorthand."""
        self.pos += 1
        ch = self.take()
        if ch == "":
            raise self.error("trailing backslash")
        if ch in SHORTHANDS:
            return Chars(*SHORTHANDS[ch])
        if ch in _CONTROL:
            code = ord(_CONTROL[ch])
        elif ch in "xuU":
            code = self.hex_escape({"x": 2, "u": 4, "U": 8}[ch])
        elif ch in _REFUSED:
            raise self.error(f"{_REFUSED[ch]} is not supported")
        elif ch.isdigit():
            raise self.error("back-references (and \\0) are not supported")
        elif ch.isalnum():
            raise self.error(f"unknown escape \\{ch}")
        else:
            code = ord(ch)
        return code

    def char_class(self) -> Chars:
        start = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            ch = self.peek()
            if ch == "":
                self.pos = start
                raise self.error("unterminated character class")
            if ch == "]" and not first:
                self.pos += 1
                break
            if ch == "[" or self.text[self.pos:self.pos + 2] in ("&&", "--", "~~"):
                raise self.error("nested classes and class set operations are not supported")
            first = False
            lo = self.class_char(ranges)
            if lo is None:
                continue
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                hi = self.class_char(ranges)
                if hi is None or hi < lo:
                    raise self.error("bad class range")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        return Chars(_merge(ranges), negated)

    def class_char(self, ranges: list) -> int | None:
        """A code point, or None after adding a shorthand's ranges to ``ranges``."""
        if self.peek() != "\\":
            return ord(self.take())
        value = self.escape()
        if isinstance(value, int):
            return value
        ranges.extend(_complement(value.ranges) if value.negated else value.ranges)
        return None


def parse(regex: str):
    """The tree of ``regex`` (a leading ``^`` and trailing unescaped ``$`` dropped).

    Raises RegexError for syntax outside the supported subset (see the module docstring).
    """
    if not isinstance(regex, str):
        raise RegexError(f"a regex must be a str, got {type(regex).__name__}")
    text = regex[1:] if regex.startswith("^") else regex
    if text.endswith("$") and (len(text) - 1 - len(text[:-1].rstrip("\\"))) % 2 == 0:
        text = text[:-1]  # an unescaped trailing $
    parser = _Parser(text)
    node = parser.alternation()
    if parser.pos < len(text):
        raise parser.error("unbalanced ')'")
    return node


# ------------------------------------------------------------------ writing a tree back
_META = set("\\.+*?()|[]{}^$")
_CLASS_META = set("\\[]-^&~")


def _escape_char(code: int, python: bool, in_class: bool) -> str:
    ch = chr(code)
    if 0x20 <= code < 0x7F:
        return "\\" + ch if ch in (_CLASS_META if in_class else _META) else ch
    if python:
        return f"\\x{code:02x}" if code < 0x100 else (f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return f"\\x{{{code:x}}}"


def to_regex(node, python: bool = False) -> str:
    """Writes a tree as a regex: Rust syntax (outlines-core) or, with ``python``, ``re`` syntax.

    Both are unambiguous re-writings of the same language: every non-ASCII or non-printable
    character is escaped and every class is spelled out (no shorthands)."""
    if isinstance(node, Chars):
        single = node.literal
        if single is not None:
            return _escape_char(ord(single), python, in_class=False)
        parts = "".join(_escape_char(lo, python, True) if lo == hi else
                        f"{_escape_char(lo, python, True)}-{_escape_char(hi, python, True)}"
                        for lo, hi in node.ranges)
        if not parts:  # no character at all (e.g. only NUL, removed by normalize)
            return "[^\\x00-\\U0010ffff]" if python else "[^\\x00-\\x{10ffff}]"
        return f"[{'^' if node.negated else ''}{parts}]"
    if isinstance(node, Concat):
        return "".join(f"(?:{to_regex(i, python)})" if isinstance(i, Alt) else to_regex(i, python)
                       for i in node.items)
    if isinstance(node, Alt):
        return "|".join(to_regex(o, python) for o in node.options)
    if isinstance(node, Repeat):
        inner = to_regex(node.item, python)
        if not (isinstance(node.item, Chars)):
            inner = f"(?:{inner})"
        return inner + quantifier(node.lo, node.hi)
    raise TypeError(f"not a regex tree node: {node!r}")


def quantifier(lo: int, hi: int | None) -> str:
    """``*``, ``+``, ``?``, ``{m}``, ``{m,}`` or ``{m,n}`` (the same in regex and GBNF)."""
    if (lo, hi) == (0, None):
        return "*"
    if (lo, hi) == (1, None):
        return "+"
    if (lo, hi) == (0, 1):
        return "?"
    if hi is None:
        return f"{{{lo},}}"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def without_nul(node):
    """The tree without the NUL character anywhere (no grammar may produce it: the compiler
    uses it as its end marker)."""
    if isinstance(node, Chars):
        if node.negated:
            return Chars(_merge(node.ranges + ((0, 0),)), True)
        return Chars(tuple((max(lo, 1), hi) for lo, hi in node.ranges if hi >= 1))
    if isinstance(node, Concat):
        return Concat(tuple(without_nul(i) for i in node.items))
    if isinstance(node, Alt):
        return Alt(tuple(without_nul(o) for o in node.options))
    if isinstance(node, Repeat):
        return Repeat(without_nul(node.item), node.lo, node.hi)
    raise TypeError(f"not a regex tree node: {node!r}")


def normalize(regex: str) -> str:
    """The canonical Rust-syntax spelling of ``regex`` without NUL (what every consumer sees)."""
    return to_regex(without_nul(parse(regex)))


def expanded_size(node) -> int:
    """Character positions of a parsed regex with its counted repetitions written out (an
    unbounded one counted once): a cheap bound on the work of compiling it, checked before
    compiling untrusted grammars."""
    if isinstance(node, Chars):
        return 1
    if isinstance(node, (Concat, Alt)):
        return sum(expanded_size(x) for x in (node.items if isinstance(node, Concat) else node.options))
    if isinstance(node, Repeat):
        return expanded_size(node.item) * max(node.lo, node.hi if node.hi is not None else node.lo, 1)
    raise TypeError(f"not a regex tree node: {node!r}")
