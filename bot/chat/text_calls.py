"""Tool calls that a model wrote as text.

Small models served by llama.cpp (Qwen2.5-Coder 0.5B and 1.5B among them) often answer a tool offer with
the call written in `content` - a fenced JSON block, a bare object, a Hermes/Qwen `<tool_call>` tag - and
no `tool_calls` at all, because the server's template parser did not recognise what they wrote. Taken at
face value, that JSON becomes the bot's reply and nothing is saved. `parse_text_calls` turns such content
back into calls plus the reply text around them; `strip_tool_json` makes sure that, whatever a model
sends, tool-call JSON is never posted to a channel.

Everything here is pure (stdlib only, nothing from the rest of the bot) and reads model output, which is
untrusted: no input makes these functions raise, and the work they do is bounded whatever the content
(deep nesting, megabytes of braces, hundreds of calls).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ParsedContent", "TextCall", "parse_text_calls", "strip_tool_json"]


@dataclass(frozen=True)
class TextCall:
    """One call of an offered tool found in a reply's text.

    `arguments` is None when the arguments could not be read as a JSON object, so the caller can answer
    the model with an error instead of guessing; `raw_arguments` keeps them as JSON text either way, for
    the tool result and the logs.
    """

    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str


@dataclass(frozen=True)
class ParsedContent:
    """The calls found in a reply's content, and the text left once they are taken out (what may be posted)."""

    calls: list[TextCall]
    text: str


# Bounds that keep the work linear-ish on hostile content. Real calls are a few levels deep and a few
# hundred characters long; these leave ample room for them and stop runaway inputs early.
_MAX_DEPTH = 32  # nesting accepted before decoding; also keeps json's recursive decoder far from the limit
_MAX_CANDIDATES = 5_000  # '{' / '[' positions tried per scan
_SCAN_STEPS = 150_000  # structural tokens (plus characters / 256) examined per scan, all candidates together
_MAX_FENCES = 10_000  # ``` markers considered
_MAX_TAGS = 10_000  # <tool_call> markers considered
_WALK_NODES = 10_000  # JSON nodes inspected when looking for a call nested in a value
_LEFTOVER_PASSES = 200  # fallback cuts in strip_tool_json before it gives up and cuts everything after

_OPEN = re.compile(r"[\[{]")
_STRUCT = re.compile(r'[\[\]{}"]')
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
_FENCE = re.compile(r"`{3,}")
_FENCE_LANG = re.compile(r"[\w+.#-]*")
_TAG = re.compile(r"<\s*(/?)\s*tool_call\s*>", re.IGNORECASE)
_SEPARATORS = re.compile(r"[\s,;]*")
_NAME_KEY = re.compile(r'"name"\s*:')
_ARGS_KEY = re.compile(r'"(?:arguments|parameters)"\s*:')
_MARKERS = re.compile(r'"name"|"arguments"|"parameters"|"ok"|"error"|<\s*/?\s*tool_call', re.IGNORECASE)
# Keys of the results the memory tools send back: a small model may echo them as its answer.
_RESULT_KEYS = frozenset({
    "ok", "error", "memory_id", "forgotten", "forgotten_to_make_room", "already_remembered_as", "text", "note",
    "similar_memories", "hint", "merged_to_make_room", "absorbed",
})

_UNCLOSED = -1
_TOO_DEEP = -2
_EXHAUSTED = -3


# ---------------------------------------------------------------------------------------------------------
# Bounded JSON scanning


class _Budget:
    """Work left for one scan; shared by every candidate so that the total stays bounded, not each try."""

    __slots__ = ("candidates", "steps")

    def __init__(self) -> None:
        self.candidates = _MAX_CANDIDATES
        self.steps = _SCAN_STEPS

    @property
    def exhausted(self) -> bool:
        return self.candidates <= 0 or self.steps <= 0


def _span_end(s: str, start: int, budget: _Budget, max_depth: int = _MAX_DEPTH) -> int:
    """Where the bracketed value opening at `start` closes (exclusive), or a negative code.

    A cheap, string-aware bracket count run before `json` decodes anything: it refuses values nested
    deeper than `max_depth` (which would otherwise cost a RecursionError deep inside the decoder) and
    values that never close, and it charges its work to the shared budget.
    """
    depth = 0
    pos = start
    while True:
        m = _STRUCT.search(s, pos)
        if m is None:
            return _UNCLOSED
        i = m.start()
        budget.steps -= 1 + (i - pos) // 256
        if budget.steps <= 0:
            return _EXHAUSTED
        ch = s[i]
        if ch == '"':
            rest = _STRING_REST.match(s, i + 1)  # always matches, possibly nothing
            end = rest.end() if rest else len(s)
            budget.steps -= (end - i) // 256
            if end >= len(s):
                return _UNCLOSED
            pos = end + 1
            continue
        pos = i + 1
        if ch in "{[":
            depth += 1
            if depth > max_depth:
                return _TOO_DEEP
        else:
            depth -= 1
            if depth <= 0:
                return pos


_DECODER = json.JSONDecoder()


def _decode_at(s: str, start: int, budget: _Budget) -> tuple[int, Any] | None:
    """Decode the JSON value opening at `start` if it is closed and shallow enough, else None."""
    end = _span_end(s, start, budget)
    if end < 0:
        return None
    try:
        value, stop = _DECODER.raw_decode(s, start)
    except (ValueError, RecursionError):
        return None
    return stop, value


def _loads_bounded(text: str) -> Any:
    """`json.loads` for a short string of untrusted JSON, refusing deep or runaway input; raises ValueError."""
    stripped = text.strip()
    if not stripped:
        raise ValueError("empty")
    if stripped[0] in "{[":
        budget = _Budget()
        end = _span_end(stripped, 0, budget)
        if end < 0:
            raise ValueError("not a closed, shallow JSON value")
    try:
        return json.loads(stripped)
    except RecursionError as exc:
        raise ValueError("too deep") from exc


def _undoubled_at(s: str, start: int, budget: _Budget) -> tuple[int, Any] | None:
    """Decode `{{...}}` written by a template that doubled every brace, reading `{{`/`}}` as `{`/`}`."""
    end = _span_end(s, start, budget, 2 * _MAX_DEPTH)
    if end < 0:
        return None
    chunk = s[start:end].replace("{{", "{").replace("}}", "}")
    try:
        return end, _loads_bounded(chunk)
    except ValueError:
        return None


def _scan(s: str, budget: _Budget, accept_undoubled: Callable[[Any], bool]) -> Iterator[tuple[int, int, Any]]:
    """Yield (start, end, value) for each JSON object or list in `s`, left to right, without overlaps.

    Every '{' or '[' is a candidate; a decoded value is skipped as a whole (what is inside a value that
    is not a call is part of that value, not a call of its own). A `{{` opening is first read with its
    braces undoubled, kept only if `accept_undoubled` wants the result; otherwise the scan goes on inside.
    """
    pos = 0
    while not budget.exhausted:
        m = _OPEN.search(s, pos)
        if m is None:
            return
        i = m.start()
        budget.candidates -= 1
        if s.startswith("{{", i):
            found = _undoubled_at(s, i, budget)
            if found is not None and accept_undoubled(found[1]):
                yield i, found[0], found[1]
                pos = found[0]
                continue
        decoded = _decode_at(s, i, budget)
        if decoded is None:
            pos = i + 1
            continue
        yield i, decoded[0], decoded[1]
        pos = decoded[0]


def _expand_braces(s: str, start: int, end: int) -> tuple[int, int]:
    """Widen a span over extra braces around it (`{ {"name": ...} }`), left by a template that doubled them."""
    for _ in range(4):
        left = start - 1
        while left >= 0 and s[left] in " \t\r\n":
            left -= 1
        right = end
        while right < len(s) and s[right] in " \t\r\n":
            right += 1
        if left >= 0 and right < len(s) and s[left] == "{" and s[right] == "}":
            start, end = left, right + 1
        else:
            break
    return start, end


# ---------------------------------------------------------------------------------------------------------
# What counts as a call


def _call_shape(obj: dict[str, Any]) -> tuple[str, Any] | None:
    """(name, arguments) of an object written like a call, in any of the shapes models use, else None.

    Shapes: `{"name", "arguments"}`, `{"name", "parameters"}`, `{"function": {...}}` and
    `{"type": "function", ...}` (the OpenAI wire shape, with or without the wrapper). A tool definition
    echoed back (parameters that are a JSON schema) is not a call.
    """
    fn = obj.get("function")
    if isinstance(fn, dict):
        obj = fn
    name = obj.get("name")
    if not isinstance(name, str):
        return None
    if "arguments" in obj:
        args = obj["arguments"]
    elif "parameters" in obj:
        args = obj["parameters"]
    else:
        return None
    if isinstance(args, dict) and args.get("type") == "object" and isinstance(args.get("properties"), dict):
        return None
    return name.strip(), args


def _offered_name(name: str, offered: frozenset[str]) -> str | None:
    """The offered tool a written name refers to; some models prefix names with `functions.`."""
    if name in offered:
        return name
    if name.startswith("functions.") and name[len("functions.") :] in offered:
        return name[len("functions.") :]
    return None


def _read_arguments(args: Any) -> tuple[dict[str, Any] | None, str]:
    """Arguments as an object (None if they are not one) and as JSON text; a JSON string is decoded."""
    if isinstance(args, dict):
        return args, json.dumps(args, ensure_ascii=False)
    if isinstance(args, str):
        for attempt in (args, args.strip().replace("{{", "{").replace("}}", "}")):
            try:
                value = _loads_bounded(attempt)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value, args
        return None, args
    try:
        return None, json.dumps(args, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return None, ""


def _offered_calls(value: Any, offered: frozenset[str]) -> list[TextCall] | None:
    """The calls a decoded JSON value stands for, if it is wholly calls of offered tools, else None.

    A value is one call object, a list of call objects, or `{"tool_calls": [...]}`. A list that also holds
    something else (or a tool that was not offered) is not taken apart: it stays text, as written.
    """
    items: list[Any]
    if isinstance(value, dict):
        inner = value.get("tool_calls")
        items = inner if isinstance(inner, list) and inner and _call_shape(value) is None else [value]
    elif isinstance(value, list) and value:
        items = value
    else:
        return None
    calls: list[TextCall] = []
    for item in items:
        if not isinstance(item, dict):
            return None
        shape = _call_shape(item)
        if shape is None:
            return None
        name = _offered_name(shape[0], offered)
        if name is None:
            return None
        arguments, raw = _read_arguments(shape[1])
        calls.append(TextCall(name=name, arguments=arguments, raw_arguments=raw))
    return calls


def _looks_like_tool_json(value: Any) -> bool:
    """True if a decoded value holds, anywhere inside, an object shaped like a call, a tool definition, or a
    memory tool's result (small models echo those as their answer)."""
    stack = [value]
    nodes = 0
    while stack and nodes < _WALK_NODES:
        node = stack.pop()
        nodes += 1
        if isinstance(node, dict):
            if isinstance(node.get("name"), str) and ("arguments" in node or "parameters" in node):
                return True
            if node and set(node) <= _RESULT_KEYS and ("ok" in node or "error" in node):  # an echoed tool result
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


# ---------------------------------------------------------------------------------------------------------
# Spans, wrappers and the text left


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _group_calls(s: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Join call spans separated only by whitespace, commas or semicolons, so no separators are left over."""
    groups: list[tuple[int, int]] = []
    for start, end in _merge(spans):
        if groups and _SEPARATORS.fullmatch(s, groups[-1][1], start):
            groups[-1] = (groups[-1][0], end)
        else:
            groups.append((start, end))
    return groups


def _only_removed(s: str, start: int, end: int, removed: list[tuple[int, int]], filler: re.Pattern[str]) -> bool:
    """True if s[start:end] holds at least one removed span and otherwise only `filler`."""
    pos = start
    touched = False
    for r_start, r_end in removed:
        if r_end <= start or r_start >= end:
            continue
        if r_start < start or r_end > end:
            return False
        if not filler.fullmatch(s, pos, r_start):
            return False
        touched = True
        pos = r_end
    return touched and filler.fullmatch(s, pos, end) is not None


def _inside(removed: list[tuple[int, int]], start: int, end: int) -> bool:
    return any(r_start < end and r_end > start for r_start, r_end in removed)


def _fences(s: str) -> list[tuple[int, int, int, int]]:
    """Fenced blocks as (open_start, body_start, body_end, close_end); an unclosed last one runs to the end."""
    marks = []
    for count, m in enumerate(_FENCE.finditer(s)):
        if count >= _MAX_FENCES:
            break
        marks.append((m.start(), m.end()))
    blocks = []
    for k in range(0, len(marks), 2):
        open_start, open_end = marks[k]
        lang = _FENCE_LANG.match(s, open_end)  # always matches, possibly nothing
        body_start = lang.end() if lang else open_end
        if k + 1 < len(marks):
            close_start, close_end = marks[k + 1]
        else:
            close_start = close_end = len(s)
        blocks.append((open_start, min(body_start, close_start), close_start, close_end))
    return blocks


def _tags(s: str) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int]]]:
    """`<tool_call>` regions as (open_start, body_start, body_end, close_end), and stray closing tags.

    A region ends at its closing tag, at the next opening tag (a model that forgot to close one) or at
    the end of the content (a reply cut short).
    """
    marks = []
    for count, m in enumerate(_TAG.finditer(s)):
        if count >= _MAX_TAGS:
            break
        marks.append((m.start(), m.end(), m.group(1) == "/"))
    regions = []
    strays = []
    k = 0
    while k < len(marks):
        start, end, closing = marks[k]
        if closing:
            strays.append((start, end))
            k += 1
            continue
        if k + 1 < len(marks):
            n_start, n_end, n_closing = marks[k + 1]
            if n_closing:
                regions.append((start, end, n_start, n_end))
                k += 2
                continue
            regions.append((start, end, n_start, n_start))
        else:
            regions.append((start, end, len(s), len(s)))
        k += 1
    return regions, strays


_WHITESPACE = re.compile(r"\s*")


def _absorb_wrappers(s: str, removed: list[tuple[int, int]], drop_tags: bool) -> list[tuple[int, int]]:
    """Add the fences and `<tool_call>` tags that wrapped removed JSON, so no empty shells are left.

    A wrapper holding only removed JSON goes whole; a tag that also holds other text loses its markup
    but keeps that text. With `drop_tags`, every tag region goes whole, with whatever it holds.
    """
    fences = _fences(s)
    regions, strays = _tags(s)
    removed = _merge(removed)
    extra: list[tuple[int, int]] = list(strays)
    for open_start, body_start, body_end, close_end in regions:
        if drop_tags or _only_removed(s, body_start, body_end, removed, _WHITESPACE):
            extra.append((open_start, close_end))
        elif _inside(removed, body_start, body_end):
            extra.extend([(open_start, body_start), (body_end, close_end)])
    removed = _merge(removed + extra)
    # Twice, for a fence inside a tag and a tag inside a fence.
    for _ in range(2):
        extra = []
        for open_start, body_start, body_end, close_end in fences:
            if _only_removed(s, body_start, body_end, removed, _SEPARATORS):
                extra.append((open_start, close_end))
        for open_start, body_start, body_end, close_end in regions:
            if _only_removed(s, body_start, body_end, removed, _WHITESPACE):
                extra.append((open_start, close_end))
        if not extra:
            break
        removed = _merge(removed + extra)
    return removed


def _cut(s: str, removed: list[tuple[int, int]]) -> str:
    """`s` without the removed spans, stripped; each seam closes up as it was spaced: nothing, a space, a line break or two."""
    pieces: list[str] = []
    pos = 0
    for start, end in _merge(removed):
        pieces.append(s[pos:start])
        pos = end
    pieces.append(s[pos:])
    out: list[str] = []
    spaced = False  # whitespace at the current seam, on either side
    breaks = 0  # the most line breaks in one gap at the current seam
    for piece in pieces:
        body = piece.strip()
        if not body:
            spaced = spaced or bool(piece)
            breaks = max(breaks, piece.count("\n"))
            continue
        lead = piece[: len(piece) - len(piece.lstrip())]
        spaced = spaced or bool(lead)
        breaks = max(breaks, lead.count("\n"))
        if out:
            out.append("\n\n" if breaks >= 2 else "\n" if breaks == 1 else " " if spaced else "")
        out.append(body)
        trail = piece[len(piece.rstrip()) :]
        spaced, breaks = bool(trail), trail.count("\n")
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------
# Public API


def parse_text_calls(content: str, offered: Collection[str], *, max_calls: int = 50) -> ParsedContent:
    """Read the tool calls a model wrote in its content, and the reply text around them.

    Meant for a response that offered tools and came back without `tool_calls`. Only calls of offered
    tools count, so JSON that merely looks like a call (another tool, a user's example) stays in the text.
    At most `max_calls` calls are returned, but every recognised call is taken out of the text, so a
    flood of calls is never posted either. Never raises: on anything unexpected, no calls and the content.
    """
    if not isinstance(content, str):
        return ParsedContent(calls=[], text="")
    try:
        return _parse(content, frozenset(name for name in offered if isinstance(name, str)), max(0, int(max_calls)))
    except Exception:
        return ParsedContent(calls=[], text=content.strip())


def _parse(content: str, offered: frozenset[str], max_calls: int) -> ParsedContent:
    if not offered or not content.strip():
        return ParsedContent(calls=[], text=content.strip())
    calls: list[TextCall] = []
    spans: list[tuple[int, int]] = []
    budget = _Budget()
    for start, end, value in _scan(content, budget, lambda v: _offered_calls(v, offered) is not None):
        found = _offered_calls(value, offered)
        if found is None:
            continue
        calls.extend(found[: max(0, max_calls - len(calls))])
        spans.append(_expand_braces(content, start, end))
    if not spans:
        return ParsedContent(calls=[], text=content.strip())
    removed = _absorb_wrappers(content, _group_calls(content, spans), drop_tags=False)
    return ParsedContent(calls=calls, text=_cut(content, removed))


def strip_tool_json(text: str) -> str:
    """Remove anything that looks like tool-call JSON from text about to be posted; keep the rest.

    The last line of defence before a message goes out: whichever tools were offered, whatever shape the
    model wrote, no call JSON (objects with "name" and "arguments" or "parameters", nested or not, whole
    or cut short) and no `<tool_call>` markup reaches a channel. Text without any returns unchanged.
    Never raises; if something unexpected happens and the text carries call markers, nothing is posted.
    """
    if not isinstance(text, str):
        return ""
    try:
        return _strip(text)
    except Exception:
        return "" if _MARKERS.search(text) else text


def _strip(text: str) -> str:
    if not _MARKERS.search(text):
        return text
    spans: list[tuple[int, int]] = []
    budget = _Budget()
    for start, end, value in _scan(text, budget, _looks_like_tool_json):
        if _looks_like_tool_json(value):
            spans.append(_expand_braces(text, start, end))
    removed = _absorb_wrappers(text, _group_calls(text, spans), drop_tags=True)
    cleaned = _cut(text, removed) if removed else text
    return _cut_leftovers(cleaned)


def _cut_leftovers(text: str) -> str:
    """Cut call-like JSON the structured scan could not read: truncated, too deep, or past the budget.

    Finds a "name" key near an "arguments"/"parameters" key and removes from the brace before them to the
    end of that object, or to the end of the text when it never closes (or when finding the end would cost
    too much). Gives up after a bounded number of cuts by dropping everything from the first remaining
    marker: better a short reply than a leak.
    """
    budget = _Budget()
    pos = 0
    for _ in range(_LEFTOVER_PASSES):
        hit = _leftover_start(text, pos)
        if hit is None:
            return text
        end = _span_end(text, hit, budget, max_depth=len(text) + 1) if text[hit] in "{[" else _UNCLOSED
        if end < 0:
            end = len(text)
        text = _cut(text, [(hit, end)])
        pos = max(0, hit - 2)
    hit = _leftover_start(text, pos)
    return text if hit is None else text[:hit].strip()


def _leftover_start(text: str, pos: int) -> int | None:
    """Start of the first call-like leftover at or after `pos`, or None.

    Looks at a bounded number of "arguments"/"parameters" keys; past that, the first unexamined one is
    reported as a leftover, so hostile text full of such keys costs little and still posts none.
    """
    for count, args in enumerate(_ARGS_KEY.finditer(text, pos)):
        if count >= _MAX_TAGS:
            return args.start()
        name = _NAME_KEY.search(text, max(0, args.start() - 1000), args.end() + 1000)
        if name is None:
            continue
        first = min(name.start(), args.start())
        brace = text.rfind("{", max(0, first - 1000), first)
        start = first if brace < 0 else brace
        while start > 0 and text[start - 1] in "{[ \t\r\n":
            start -= 1
        while start < len(text) and text[start] in " \t\r\n":
            start += 1
        return start
    return None
