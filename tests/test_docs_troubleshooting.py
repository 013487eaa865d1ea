"""docs/troubleshooting.md quotes what the code really prints, so the page cannot go stale.

The page's markup (its introduction says the same to readers):

- Each entry is a `###` heading. Every ```` ```text ```` block on the page is one message khorovod
  prints, quoted as printed: `<...>` stands for a value filled in at run time (a rank, a name, a
  number), `...` for text left out. A first line `SomeError: ...` names the exception raised.
- A line starting with `> Horovod:` quotes what Horovod printed in the same situation; its entry
  must quote our message too (a ```` ```text ```` block), so a Horovod user lands on our answer.

A message is checked against the string literals of `horovod/` (parsed, so f-strings and implicit
concatenation count as the code writes them, and docstrings do not count): every fixed fragment
between placeholders must lie inside one literal, or be literals joined as the code joins them at
run time (the end of one, whole ones, the start of another: a prefix built in one module and a
reason in another). Order across literals is not checked, since code often builds the end of a
message before its start. Renaming a message in the code fails here. No subprocess, no import of
the package: parsing it takes about a second.
"""

from __future__ import annotations

import ast
import builtins
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "troubleshooting.md"
PACKAGE = REPO / "horovod"

PLACEHOLDER = re.compile(r"<[^<>\n]*>|\.\.\.|…")
TRIM = " \t\n.,;:()[]{}'\"`"  # joints between a literal and a formatted value, not the message
EXCEPTION_PREFIX = re.compile(r"^(\w+(?:Error|Exception|Warning|Interrupt)): ")
SPECIFIC = 12  # a message must have one fragment at least this long, or it would match anything


@dataclass(frozen=True)
class Quote:
    section: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"troubleshooting.md:{self.line} ({self.section}): {self.text[:80]!r}"


@dataclass
class Section:
    title: str
    anchor: str
    messages: list[Quote]
    horovod_quotes: list[Quote]
    links: list[str]


def _anchor(title: str) -> str:
    """The id MkDocs (Python-Markdown's toc) gives a heading."""
    text = re.sub(r"[^\w\s-]", "", title.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


@functools.cache
def sections() -> list[Section]:
    found: list[Section] = []
    current = Section("(before the first entry)", "", [], [], [])
    lines = PAGE.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```text"):
            end = lines.index("```", i + 1)
            current.messages.append(Quote(current.title, i + 1, "\n".join(lines[i + 1:end])))
            i = end + 1
            continue
        if line.startswith("```"):  # another kind of block: skip it whole
            i = lines.index("```", i + 1) + 1
            continue
        if line.startswith("#"):
            current = Section(line.lstrip("#").strip(), _anchor(line.lstrip("#").strip()), [], [], [])
            found.append(current)
        elif line.startswith("> Horovod:"):
            current.horovod_quotes.append(Quote(current.title, i + 1, line[len("> Horovod:"):].strip()))
        current.links += re.findall(r"\]\(#([\w-]+)\)", line)
        i += 1
    return found


def all_messages() -> list[Quote]:
    return [quote for section in sections() for quote in section.messages]


def fragments(message: str) -> tuple[str | None, list[str]]:
    """The exception named by the quote (if any) and its fixed fragments, in order."""
    first, _, rest = message.partition("\n")
    match = EXCEPTION_PREFIX.match(first)
    exception = match.group(1) if match else None
    if match:
        message = first[match.end():] + ("\n" + rest if rest else "")
    pieces = []
    for part in PLACEHOLDER.split(message):
        for line in part.splitlines():
            piece = line.strip(TRIM)
            if piece:
                pieces.append(piece)
    return exception, pieces


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of docstring nodes: they explain, they are not printed."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


@functools.cache
def literals() -> dict[Path, list[str]]:
    """Each module's string literals, docstrings left out (an f-string gives its fixed parts)."""
    result = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        skip = _docstrings(tree)
        result[path] = [node.value for node in ast.walk(tree)
                        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip]
    return result


@functools.cache
def exception_classes() -> set[str]:
    return {node.name for path in sorted(PACKAGE.rglob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)}


@functools.cache
def _all_literals() -> tuple[str, ...]:
    return tuple(sorted({text for strings in literals().values() for text in strings}))


def _joined_at_run_time(piece: str) -> bool:
    """Whether `piece` is literals joined as the code joins them: the end of one literal, whole
    literals, then the start of another (a prefix and a reason built in different places)."""
    strings = _all_literals()
    whole = set(strings)
    frontier = set()
    for text in strings:  # the end of a literal that the piece starts with
        k = text.find(piece[0])
        while k >= 0:
            if 2 <= len(text) - k < len(piece) and piece.startswith(text[k:]):
                frontier.add(len(text) - k)
            k = text.find(piece[0], k + 1)
    seen = set()
    while frontier:
        at = frontier.pop()
        seen.add(at)
        rest = piece[at:]
        if len(rest) >= 2 and any(text.startswith(rest) for text in strings):
            return True
        frontier |= {end for end in range(at + 2, len(piece)) if piece[at:end] in whole} - seen
    return False


@functools.cache
def _found(piece: str) -> bool:
    return any(piece in text for text in _all_literals()) or _joined_at_run_time(piece)


def missing(message: str) -> list[str]:
    """The fragments of a quote that the code does not print."""
    return [piece for piece in fragments(message)[1] if not _found(piece)]


def test_the_page_quotes_many_messages_each_specific_enough():
    quotes = all_messages()
    assert len(quotes) >= 60, len(quotes)
    for quote in quotes:
        _, pieces = fragments(quote.text)
        assert pieces and max(map(len, pieces)) >= SPECIFIC, f"{quote}: too little fixed text to check"


@pytest.mark.parametrize("quote", all_messages(), ids=lambda q: f"line{q.line}")
def test_each_quoted_message_is_printed_by_the_code(quote):
    absent = missing(quote.text)
    assert not absent, f"{quote}\nnot in any string literal under horovod/: {absent}"
    exception, _ = fragments(quote.text)
    if exception:  # raised where the message is built, or where an engine fails the op with it
        assert exception in dir(builtins) or exception in exception_classes(), (
            f"{quote}: {exception} is neither a builtin nor a class of horovod/")


def test_a_renamed_or_invented_message_fails():
    """The check is not vacuous: a changed word, a message of Horovod's we do not print, fail."""
    real = ("rank <r> has shut down (it called hvd.shutdown() or its script ended), so this collective "
            "can never complete.")
    assert missing(real) == []
    assert missing(real.replace("shut down", "shutdown"))
    assert missing("Horovod has been shut down. This was caused by an exception on one of the ranks")
    # Literals joined at run time: the reason ends one literal, the advice starts another.
    joined = ("rank <p> on host <h> closed its connection (its process exited or crashed). The rank named "
              "here is the one that failed; look at its output for the cause.")
    assert missing(joined) == []
    assert missing(joined.replace("The rank named", "The ranks named"))


def test_horovod_messages_are_marked_and_point_at_ours():
    page = PAGE.read_text()
    by_anchor = {section.anchor: section for section in sections()}
    classic = [section for section in sections() if section.horovod_quotes]
    assert len(classic) >= 8, [s.title for s in classic]
    for section in classic:
        for quote in section.horovod_quotes:
            assert quote.text, f"{quote}: an empty Horovod quote"
            # Horovod's wording is not ours (unless we kept it on purpose: then it is quoted as ours too).
            ours = [m for m in section.messages if fragments(quote.text)[1][0] in m.text]
            assert ours or missing(quote.text), f"{quote}: we print this too; quote it as ours in a text block"
        linked = [by_anchor[a] for a in section.links if a in by_anchor]
        assert section.messages or any(s.messages for s in linked), (
            f"{section.title}: quotes Horovod but neither shows what khorovod prints nor links to an entry that does")
    for anchor in re.findall(r"\]\(#([\w-]+)\)", page):
        assert anchor in by_anchor, f"link to #{anchor}, which no heading of the page has"


def test_every_entry_heading_is_unique():
    anchors = [section.anchor for section in sections()]
    assert len(anchors) == len(set(anchors)), sorted(a for a in anchors if anchors.count(a) > 1)


# Warnings that only say something about the job's own plumbing, with why no user needs an entry.
INTERNAL_WARNINGS = {
    "rendezvous: dropped": "a malformed request to the store; its sender gets an error of its own",
    "timeline: dropped event": "an event the timeline could not format; the file stays valid",
}


def _warning_texts() -> list[tuple[str, list[str]]]:
    """(where, fixed fragments) of each `warnings.warn(...)` and `log.warning(...)` text."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                    and (node.func.attr == "warning" or (node.func.attr == "warn"
                                                         and isinstance(node.func.value, ast.Name)
                                                         and node.func.value.id == "warnings"))):
                continue
            first = node.args[0]
            parts = ([v.value for v in first.values if isinstance(v, ast.Constant)] if isinstance(first, ast.JoinedStr)
                     else [first.value] if isinstance(first, ast.Constant) and isinstance(first.value, str) else [])
            pieces = [p.strip(TRIM) for part in parts for p in re.split(r"%[-#0-9.]*[sdrgfx]", part)]
            pieces = [piece for piece in pieces if len(piece) >= 10]
            if pieces:  # none: "%s" or "rank %d: %s", whose text comes from elsewhere (and is quoted there)
                found.append((f"{path.relative_to(REPO)}:{node.lineno}", pieces))
    return found


def test_every_warning_the_package_gives_has_an_entry():
    quoted = "\n".join(quote.text for quote in all_messages())
    texts = _warning_texts()
    assert len(texts) >= 20, texts
    # An entry may elide the end of a long warning: the start of one of its fragments is enough.
    undocumented = [(where, pieces[0]) for where, pieces in texts
                    if not any(piece[:40] in quoted for piece in pieces)
                    and not any(piece.startswith(key) for piece in pieces for key in INTERNAL_WARNINGS)]
    assert not undocumented, f"warnings with no entry in docs/troubleshooting.md: {undocumented}"
