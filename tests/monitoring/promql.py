"""What a PromQL expression reads: its series selectors (metric name and label matchers),
the labels it groups or matches on. A tokenizer, not a full parser: it knows enough of
the grammar to tell a metric name from a function, an aggregation, a keyword, a label
name or a duration, and it refuses any character it does not expect, so that a construct
it cannot read fails the tests instead of hiding a metric."""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(
    r"""
      (?P<space>\s+|\#[^\n]*)
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    | (?P<variable>\$\{[^}]*\}|\$\w+)             # Grafana: ${datasource}, $__rate_interval
    | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[a-zA-Z0-9]*)   # 0.99, 1e3, 5m, 1h30m
    | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    | (?P<op>==|!=|=~|!~|<=|>=|[-+*/%^<>=(){}\[\],@])
    """,
    re.VERBOSE,
)

# Followed by a parenthesised list of label names.
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"})


@dataclass(frozen=True)
class Token:
    kind: str
    text: str


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str  # unquoted


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[Matcher, ...]


@dataclass(frozen=True)
class Expression:
    selectors: tuple[Selector, ...]
    # Labels named in by/without/on/ignoring/group_left/group_right.
    grouping: frozenset[str]

    @property
    def metrics(self) -> frozenset[str]:
        return frozenset(s.metric for s in self.selectors)


class PromQLError(ValueError):
    pass


def tokens(expr: str) -> list[Token]:
    found: list[Token] = []
    position = 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise PromQLError(f"unexpected {expr[position]!r} at {position} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            found.append(Token(kind, match.group()))
        position = match.end()
    return found


def parse(expr: str) -> Expression:
    stream = _Stream(tokens(expr))
    selectors: list[Selector] = []
    grouping: set[str] = set()
    while (token := stream.next()) is not None:
        if token.text == "[":
            stream.skip_past("]")  # a range or subquery: durations, Grafana variables
        elif token.text == "{":
            selectors.append(_nameless_selector(_matchers(stream), expr))
        elif token.kind == "ident":
            word = token.text.lower()
            if word in _LABEL_LIST_KEYWORDS and stream.peek_text() == "(":
                grouping.update(_label_list(stream))
            elif word in _KEYWORDS or _is_operator(stream):
                continue
            else:
                matchers = _matchers(stream) if stream.accept("{") else ()
                selectors.append(Selector(token.text, matchers))
    return Expression(tuple(selectors), frozenset(grouping))


def _is_operator(stream: _Stream) -> bool:
    """A function call (`rate(`) or an aggregation with its grouping first (`sum by`)."""
    following = stream.peek_text()
    return following == "(" or following.lower() in ("by", "without")


def _label_list(stream: _Stream) -> list[str]:
    """`(a, b, ...)`: label names separated by commas (a trailing one allowed)."""
    stream.expect("(")
    names: list[str] = []
    while not stream.accept(")"):
        token = stream.next()
        if token is None or token.kind != "ident":
            raise PromQLError(f"expected a label name, found {_describe(token)}")
        names.append(token.text)
        if not stream.accept(","):
            stream.expect(")")
            break
    return names


def _matchers(stream: _Stream) -> tuple[Matcher, ...]:
    """The matchers of a `{...}` whose opening brace was just read, separated by commas."""
    found: list[Matcher] = []
    while not stream.accept("}"):
        label, op, value = stream.next(), stream.next(), stream.next()
        if label is None or op is None or value is None:
            raise PromQLError("an unclosed '{'")
        if label.kind != "ident" or value.kind != "string":
            raise PromQLError(f"unreadable matcher {label.text}{op.text}{value.text}")
        if op.text not in ("=", "!=", "=~", "!~"):
            raise PromQLError(f"unknown matcher operator {op.text!r}")
        found.append(Matcher(label.text, op.text, _unquote(value.text)))
        if not stream.accept(","):
            stream.expect("}")
            break
    return tuple(found)


def _nameless_selector(matchers: tuple[Matcher, ...], expr: str) -> Selector:
    names = [m.value for m in matchers if m.label == "__name__" and m.op == "="]
    if len(names) != 1:
        raise PromQLError(f"a selector without one exact metric name in {expr!r}")
    rest = tuple(m for m in matchers if m.label != "__name__")
    return Selector(names[0], rest)


def _describe(token: Token | None) -> str:
    return repr(token.text) if token else "the end"


def _unquote(literal: str) -> str:
    body = literal[1:-1]
    if literal[0] == "`":
        return body
    return re.sub(r"\\(.)", r"\1", body)


class _Stream:
    def __init__(self, items: list[Token]) -> None:
        self._items = items
        self._at = 0

    def next(self) -> Token | None:
        if self._at >= len(self._items):
            return None
        self._at += 1
        return self._items[self._at - 1]

    def peek_text(self) -> str:
        return self._items[self._at].text if self._at < len(self._items) else ""

    def accept(self, text: str) -> bool:
        """Consume the next token if it is `text`."""
        if self.peek_text() != text:
            return False
        self._at += 1
        return True

    def expect(self, text: str) -> None:
        token = self.next()
        if token is None or token.text != text:
            raise PromQLError(f"expected {text!r}, found {_describe(token)}")

    def skip_past(self, text: str) -> None:
        while (token := self.next()) is not None:
            if token.text == text:
                return
        raise PromQLError(f"no closing {text!r}")
