"""The LOGOS grammar: loads grammar/logos.lark, lists its special tokens, validates grammar text.

The grammar file is the single definition of the language *and* of the special-token inventory:
a bare ``<Name>`` in it is an atomic vocabulary entry, and token ids follow the order of first
appearance (the file's inventory section is append-only). For validation the pure-Python Lark
parser (LALR, contextual lexer) reads the same file after the bare tags are turned into quoted
literals; constrained decoding hands the file unchanged to llguidance.

>>> validate("<MoleculeS>CC(=O)O<MoleculeE>")
>>> try:
...     validate("<MoleculeS>CC(=O<MoleculeE>")
... except GrammarError as e:
...     print(e.position)
16
"""

from __future__ import annotations

import functools
import re

import lark

from logos.util.resources import GRAMMAR, shipped

__all__ = ["GRAMMAR_VERSION", "READABLE_GRAMMARS", 
    "GRAMMAR_PATH",
    "GrammarError",
    "grammar_text",
    "special_tokens",
    "validate",
    "is_valid",
    "split_symbols",
]

# The grammar this package writes, and the versions it reads (v1 texts differ only in the crystal
# section, which the v2 parser still reads; grammar/logos.lark accepts both).
GRAMMAR_VERSION = "v2"
READABLE_GRAMMARS = ("v1", "v2")

# grammar/logos.lark of the source checkout, or its copy inside an installed wheel (logos.util.resources).
GRAMMAR_PATH = shipped(GRAMMAR)

# A special token in the grammar file: a bare <...> outside quotes, regexes and comments.
_BARE_TAG = re.compile(r"<[A-Za-z][A-Za-z0-9+]*>")


class GrammarError(ValueError):
    """Text that is not a sentence of the LOGOS grammar; ``position`` is the 0-based offset."""

    def __init__(self, message: str, position: int):
        super().__init__(message)
        self.position = position


@functools.lru_cache(maxsize=1)
def grammar_text() -> str:
    """The grammar file exactly as llguidance/xgrammar load it."""
    return GRAMMAR_PATH.read_text(encoding="utf-8")


def _code_segments(text: str):
    """Yield (is_code, chunk) for a Lark file: comments, "strings" and /regexes/ are not code."""
    i, n = 0, len(text)
    start = 0
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif c == '"' or (c == "/" and text[i - 1 : i] in (" ", ":", "|", "(")):
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            i += 1
            continue
        if i > start:
            yield True, text[start:i]
        yield False, text[i:j]
        i = start = j
    if start < n:
        yield True, text[start:]


@functools.lru_cache(maxsize=1)
def special_tokens() -> tuple[str, ...]:
    """Every special token of the grammar, in token-id order (first appearance in the file)."""
    seen: dict[str, None] = {}
    for is_code, chunk in _code_segments(grammar_text()):
        if is_code:
            for tag in _BARE_TAG.findall(chunk):
                seen.setdefault(tag, None)
    return tuple(seen)


# An inventory rule that is only a choice of special tokens ("space_group: <sg1> | <sg2> | ...").
_TOKEN_CHOICE_RULE = re.compile(r"^([a-z_]+):((?:\s*\|?[ \t]*<[A-Za-z][A-Za-z0-9+]*>)+)[ \t]*$", re.M)


@functools.lru_cache(maxsize=1)
def _python_grammar() -> tuple[str, dict[str, str]]:
    """The grammar for the pure-Python Lark parser, and a display name for each collapsed terminal.

    Bare tags become quoted literals. A rule that is a choice of several special tokens becomes one
    regex terminal: the same language, but building the LALR tables takes milliseconds, not seconds.
    """
    families: dict[str, str] = {}
    extra_terminals = []

    def collapse(m: re.Match) -> str:
        name, tags = m.group(1), _BARE_TAG.findall(m.group(2))
        if len(tags) == 1:
            return m.group(0)
        terminal = "FAMILY_" + name.upper()
        families[terminal] = f"{tags[0]}..{tags[-1]}"
        alternatives = "|".join(re.escape(t) for t in sorted(tags, key=len, reverse=True))
        extra_terminals.append(f"{terminal}: /{alternatives}/")
        return f"{name}: {terminal}"

    code = "".join(_TOKEN_CHOICE_RULE.sub(collapse, chunk) if is_code else chunk
                   for is_code, chunk in _code_segments(grammar_text()))
    code = "".join(_BARE_TAG.sub(lambda m: '"' + m.group(0) + '"', chunk) if is_code else chunk
                   for is_code, chunk in _code_segments(code))
    return code + "\n" + "\n".join(extra_terminals) + "\n", families


@functools.lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    # With interegular installed (vLLM depends on it), lark compares the regexes of every pair of terminals while it
    # builds the contextual lexer, to warn of collisions: minutes for this grammar, for a warning. Not at run time.
    checks = lark.lexer.has_interegular
    lark.lexer.has_interegular = False
    try:
        return lark.Lark(_python_grammar()[0], start="start", parser="lalr", lexer="contextual")
    finally:
        lark.lexer.has_interegular = checks


def _describe(expected) -> str:
    names = sorted({_terminal_text(t) for t in expected})
    if len(names) > 8:
        names = names[:8] + ["..."]
    return ", ".join(names)


@functools.lru_cache(maxsize=None)
def _terminal_text(name: str) -> str:
    families = _python_grammar()[1]
    if name in families:
        return families[name]
    for term in _parser().terminals:
        if term.name == name:
            pattern = term.pattern
            return repr(pattern.value) if isinstance(pattern, lark.lexer.PatternStr) else name
    return name


def validate(text: str) -> None:
    """Raise GrammarError naming the position of the first error if ``text`` is not valid."""
    try:
        _parser().parse(text)
    except lark.exceptions.UnexpectedCharacters as e:
        raise GrammarError(
            f"grammar error at position {e.pos_in_stream}: unexpected {text[e.pos_in_stream:e.pos_in_stream + 12]!r}"
            f" (expected {_describe(e.allowed)})",
            e.pos_in_stream,
        ) from None
    except lark.exceptions.UnexpectedToken as e:
        if e.token.type == "$END":
            pos = len(text)
            got = "end of text"
        else:
            pos = e.token.start_pos
            got = repr(str(e.token))
        raise GrammarError(
            f"grammar error at position {pos}: unexpected {got} (expected {_describe(e.expected)})", pos
        ) from None
    except lark.exceptions.UnexpectedEOF as e:
        raise GrammarError(
            f"grammar error at position {len(text)}: text ends early (expected {_describe(e.expected)})",
            len(text),
        ) from None


def is_valid(text: str) -> bool:
    try:
        validate(text)
    except GrammarError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _symbol_splitter() -> re.Pattern:
    return re.compile("(" + "|".join(re.escape(t) for t in sorted(special_tokens(), key=len, reverse=True)) + ")")


def split_symbols(text: str) -> list[str]:
    """Split grammar text into special tokens and the text between them (empty pieces dropped)."""
    return [p for p in _symbol_splitter().split(text) if p]
