"""Tool calls written as text: what real small models sent, every shape models use, and hostile content.

The fixture holds eight responses of Qwen2.5-Coder 0.5B and 1.5B served by llama.cpp, each a call written
as a fenced JSON block in `content` with no `tool_calls`; replayed here, each must come back as a call with
nothing left to post. Pure functions: no network, no database.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.chat.arguments import as_bool, as_list_name, as_memory_id, as_user_ref
from bot.chat.text_calls import ParsedContent, TextCall, parse_text_calls, strip_tool_json

FIXTURE = Path(__file__).parent / "data" / "llamacpp-qwen2.5-coder.jsonl"
OFFERED = ("save_memory", "update_memory", "forget_memory")
SAVE = '{"name": "save_memory", "arguments": {"text": "Juno\'s cat is called Mochi", "list": "personal"}}'
SAVE_ARGS = {"text": "Juno's cat is called Mochi", "list": "personal"}
# Hostile inputs must finish, not hang: a runaway parse (quadratic or worse) takes minutes on these inputs, a
# bounded one milliseconds. The limit is that far from both so a loaded CI machine never trips it; how fast
# the parse is belongs to the benchmarks.
FAST = 30.0


def _records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line.strip()]


def _no_call_json(text: str) -> None:
    assert '"name"' not in text
    assert '"arguments"' not in text
    assert '"parameters"' not in text
    assert "tool_call" not in text


def _parse(content: str, offered: tuple[str, ...] = OFFERED, **kwargs: Any) -> ParsedContent:
    return parse_text_calls(content, offered, **kwargs)


# ---------------------------------------------------------------------------------------------------------
# What real models sent


def test_fixture_holds_eight_recorded_responses() -> None:
    records = _records()
    assert len(records) == 8
    for record in records:
        message = record["response"]["choices"][0]["message"]
        assert not message.get("tool_calls")
        assert record["response"]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("index", range(8))
def test_every_recorded_response_is_a_call_with_nothing_left_to_post(index: int) -> None:
    record = _records()[index]
    offered = tuple(tool["function"]["name"] for tool in record["request"]["tools"])
    content = record["response"]["choices"][0]["message"]["content"]

    parsed = parse_text_calls(content, offered)

    assert parsed.calls
    for call in parsed.calls:
        assert call.name in offered
        assert isinstance(call.arguments, dict)
        assert json.loads(call.raw_arguments) == call.arguments
    _no_call_json(parsed.text)
    assert parsed.text == ""
    assert strip_tool_json(content) == ""


def test_first_recorded_response_is_save_memory_about_mochi() -> None:
    record = _records()[0]
    content = record["response"]["choices"][0]["message"]["content"]

    parsed = parse_text_calls(content, [tool["function"]["name"] for tool in record["request"]["tools"]])

    assert parsed == ParsedContent(
        calls=[
            TextCall(
                name="save_memory",
                arguments={
                    "text": "Mochi is called Juno's cat",
                    "list": "personal",
                    "about_user": "223525073110616",
                    "global": False,
                },
                raw_arguments=json.dumps(
                    {"text": "Mochi is called Juno's cat", "list": "personal", "about_user": "223525073110616", "global": False}
                ),
            )
        ],
        text="",
    )
    assert "Mochi" in parsed.calls[0].arguments["text"]  # type: ignore[index]


def test_recorded_arguments_read_leniently() -> None:
    """The arguments the models sent, as the memory tools will read them."""
    by_index = {}
    for index, record in enumerate(_records()):
        content = record["response"]["choices"][0]["message"]["content"]
        by_index[index] = parse_text_calls(content, OFFERED).calls[0]
    assert as_user_ref(by_index[0].arguments["about_user"]) == 223525073110616  # type: ignore[index]
    assert as_bool(by_index[0].arguments["global"]) is False  # type: ignore[index]
    assert as_list_name(by_index[4].arguments["list"]) == "personal"  # type: ignore[index]
    assert by_index[1].name == "update_memory"
    assert as_memory_id(by_index[1].arguments["memory_id"]) == 12  # type: ignore[index]


# ---------------------------------------------------------------------------------------------------------
# Only offered tools


def test_call_of_a_tool_not_offered_stays_text() -> None:
    content = 'Here: {"name": "search_web", "arguments": {"query": "Mochi"}}'
    parsed = _parse(content)
    assert parsed.calls == []
    assert parsed.text == content
    assert strip_tool_json(parsed.text) == "Here:"


def test_nothing_offered_means_no_calls() -> None:
    parsed = parse_text_calls(SAVE, [])
    assert parsed == ParsedContent(calls=[], text=SAVE)


def test_plain_json_that_is_not_a_call_stays_text() -> None:
    content = 'The config is:\n```json\n{"name": "Deskmate", "version": 2}\n```'
    parsed = _parse(content)
    assert parsed.calls == []
    assert parsed.text == content
    assert strip_tool_json(content) == content


def test_a_list_holding_a_tool_not_offered_stays_text() -> None:
    content = f'[{SAVE}, {{"name": "search_web", "arguments": {{}}}}]'
    assert _parse(content) == ParsedContent(calls=[], text=content)
    assert strip_tool_json(content) == ""


def test_an_echoed_tool_definition_is_not_a_call() -> None:
    content = (
        '{"type": "function", "function": {"name": "save_memory", "description": "Remember a fact.", '
        '"parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}'
    )
    assert _parse(content).calls == []
    assert strip_tool_json(content) == ""


# ---------------------------------------------------------------------------------------------------------
# Every shape


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(f"```json\n{SAVE}\n```", id="fenced-json"),
        pytest.param(f"```\n{SAVE}\n```", id="fenced-plain"),
        pytest.param(f"```JSON {SAVE} ```", id="fenced-inline"),
        pytest.param(SAVE, id="bare"),
        pytest.param(f"  \n{SAVE}\n\n", id="bare-whitespace"),
        pytest.param(SAVE.replace('"arguments"', '"parameters"'), id="parameters"),
        pytest.param(
            json.dumps({"name": "save_memory", "arguments": json.dumps(SAVE_ARGS)}),
            id="arguments-as-string",
        ),
        pytest.param(f"<tool_call>\n{SAVE}\n</tool_call>", id="hermes-tag"),
        pytest.param(f"<tool_call>\n{SAVE}", id="hermes-tag-unterminated"),
        pytest.param(f"<TOOL_CALL>{SAVE}</tool_call>", id="hermes-tag-case"),
        pytest.param(f"<tool_call>\n```json\n{SAVE}\n```\n</tool_call>", id="fence-in-tag"),
        pytest.param(f"```xml\n<tool_call>\n{SAVE}\n</tool_call>\n```", id="tag-in-fence"),
        pytest.param(json.dumps({"function": {"name": "save_memory", "arguments": SAVE_ARGS}}), id="function-wrapper"),
        pytest.param(
            json.dumps({"type": "function", "function": {"name": "save_memory", "arguments": json.dumps(SAVE_ARGS)}}),
            id="openai-wire-shape",
        ),
        pytest.param(json.dumps({"type": "function", "name": "save_memory", "arguments": SAVE_ARGS}), id="type-function-flat"),
        pytest.param(
            json.dumps({"type": "function", "name": "save_memory", "parameters": SAVE_ARGS}),
            id="type-function-parameters",
        ),
        pytest.param(
            json.dumps({"tool_calls": [{"function": {"name": "save_memory", "arguments": SAVE_ARGS}}]}),
            id="tool-calls",
        ),
        pytest.param(f"[{SAVE}]", id="list-of-one"),
        pytest.param("{" + SAVE + "}", id="doubled-outer"),
        pytest.param(SAVE.replace("{", "{{").replace("}", "}}"), id="doubled-all"),
        pytest.param("{ " + SAVE + " }", id="doubled-outer-spaced"),
        pytest.param(SAVE.replace('"save_memory"', '"functions.save_memory"'), id="functions-prefix"),
        pytest.param(f"```json\n{SAVE}", id="fence-unterminated"),
    ],
)
def test_shape_is_one_save_call_and_no_text(content: str) -> None:
    parsed = _parse(content)
    assert parsed.calls == [TextCall("save_memory", SAVE_ARGS, parsed.calls[0].raw_arguments)]
    assert json.loads(parsed.calls[0].raw_arguments) == SAVE_ARGS
    assert parsed.text == ""
    assert strip_tool_json(content) == ""


def test_text_around_a_call_is_the_reply() -> None:
    content = f"Nice to meet you, Juno!\n\n```json\n{SAVE}\n```\n\nMochi is a lovely name."
    parsed = _parse(content)
    assert [call.name for call in parsed.calls] == ["save_memory"]
    assert parsed.text == "Nice to meet you, Juno!\n\nMochi is a lovely name."
    assert strip_tool_json(content) == parsed.text


def test_a_call_inside_a_sentence_leaves_one_space() -> None:
    parsed = _parse(f"Noted {SAVE} - see you!")
    assert len(parsed.calls) == 1
    assert parsed.text == "Noted - see you!"


@pytest.mark.parametrize("separator", ["", "\n", ",\n", "; ", "\n\n"])
def test_several_calls_in_a_row(separator: str) -> None:
    forget = '{"name": "forget_memory", "arguments": {"memory_id": 3}}'
    parsed = _parse(f"Done.\n{SAVE}{separator}{forget}")
    assert [call.name for call in parsed.calls] == ["save_memory", "forget_memory"]
    assert parsed.calls[1].arguments == {"memory_id": 3}
    assert parsed.text == "Done."


def test_several_calls_in_one_fence_and_in_a_list() -> None:
    forget = '{"name": "forget_memory", "arguments": {"memory_id": 3}}'
    for content in (f"```json\n{SAVE}\n{forget}\n```", f"```json\n[{SAVE}, {forget}]\n```", f"[\n  {SAVE},\n  {forget}\n]"):
        parsed = _parse(content)
        assert [call.name for call in parsed.calls] == ["save_memory", "forget_memory"], content
        assert parsed.text == "", content


def test_several_tags_one_left_open() -> None:
    forget = '{"name": "forget_memory", "arguments": {"memory_id": 3}}'
    parsed = _parse(f"<tool_call>\n{SAVE}\n</tool_call>\n<tool_call>\n{forget}\n")
    assert [call.name for call in parsed.calls] == ["save_memory", "forget_memory"]
    assert parsed.text == ""


def test_a_tag_opened_again_before_closing() -> None:
    forget = '{"name": "forget_memory", "arguments": {"memory_id": 3}}'
    parsed = _parse(f"<tool_call>{SAVE}<tool_call>{forget}</tool_call>")
    assert [call.name for call in parsed.calls] == ["save_memory", "forget_memory"]
    assert parsed.text == ""


def test_offered_call_next_to_one_not_offered() -> None:
    other = '{"name": "search_web", "arguments": {"query": "cats"}}'
    parsed = _parse(f"```json\n{SAVE}\n```\n```json\n{other}\n```")
    assert [call.name for call in parsed.calls] == ["save_memory"]
    assert parsed.text == f"```json\n{other}\n```"
    assert strip_tool_json(parsed.text) == ""


@pytest.mark.parametrize(
    ("arguments", "expected", "raw"),
    [
        ('"not json"', None, "not json"),
        ('"[1, 2]"', None, "[1, 2]"),
        ("[1, 2]", None, "[1, 2]"),
        ("null", None, "null"),
        ('"{{\\"memory_id\\": 3}}"', {"memory_id": 3}, '{{"memory_id": 3}}'),
        ("{}", {}, "{}"),
    ],
)
def test_arguments_that_are_not_an_object(arguments: str, expected: dict[str, Any] | None, raw: str) -> None:
    parsed = _parse(f'{{"name": "forget_memory", "arguments": {arguments}}}')
    assert parsed.calls == [TextCall("forget_memory", expected, raw)]
    assert parsed.text == ""


def test_name_must_be_a_string() -> None:
    content = '{"name": ["save_memory"], "arguments": {}}'
    assert _parse(content).calls == []


def test_a_call_cut_short_is_no_call_and_is_never_posted() -> None:
    content = 'Saving it. {"name": "save_memory", "arguments": {"text": "Juno\'s cat'
    assert _parse(content) == ParsedContent(calls=[], text=content)
    assert strip_tool_json(content) == "Saving it."


def test_call_json_is_not_posted_whatever_the_tool() -> None:
    content = (
        "Sure!\n"
        '<tool_call>{"name": "anything", "arguments": {}}</tool_call>\n'
        '{"outer": {"name": "x", "parameters": {"a": 1}}}\n'
        '[{"id": "c1", "type": "function", "function": {"name": "y", "arguments": "{}"}}]\n'
        "Bye."
    )
    assert strip_tool_json(content) == "Sure!\nBye."


def test_strip_leaves_text_without_tool_json_untouched() -> None:
    for text in ("", "  hi  ", "Use `{}` and [links](x).", '{"name": "Juno"}', "```python\nprint({'a': 1})\n```"):
        assert strip_tool_json(text) == text


# ---------------------------------------------------------------------------------------------------------
# Hostile content: never raises, bounded work


def _timed(content: str, **kwargs: Any) -> tuple[ParsedContent, str]:
    started = time.perf_counter()
    parsed = _parse(content, **kwargs)
    stripped = strip_tool_json(content)
    assert time.perf_counter() - started < FAST
    return parsed, stripped


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("[" * 100_000, id="deep-lists"),
        pytest.param("{" * 100_000, id="deep-braces"),
        pytest.param("[1," * 100_000, id="deep-lists-with-items"),
        pytest.param('{"a":' * 100_000, id="deep-objects"),
        pytest.param("[" * 100_000 + "]" * 100_000, id="deep-closed"),
        pytest.param("{" * 1_000_000, id="1MB-open-braces"),
        pytest.param("}" * 1_000_000, id="1MB-close-braces"),
        pytest.param("{}" * 500_000, id="1MB-empty-objects"),
        pytest.param("{{" * 500_000, id="1MB-doubled"),
        pytest.param('["' * 300_000, id="open-strings"),
        pytest.param(("[" + '"a",' * 1000) * 250, id="nested-unclosed-lists"),
        pytest.param("```" * 300_000, id="fences"),
        pytest.param("<tool_call>" * 100_000, id="tags"),
        pytest.param('{"name": "save_memory", "arguments": ' * 50_000, id="unclosed-calls"),
        pytest.param('{"name": "save_memory", "arguments": {"text": "' + "a" * 1_000_000, id="unclosed-string"),
        pytest.param('{"name": "save_memory", "arguments": {"memory_id": ' + "9" * 5000 + "}}", id="huge-int"),
        pytest.param('{"name": "save_memory", "arguments": ' + "[" * 500 + "]" * 500 + "}", id="deep-arguments"),
        pytest.param("\x00\ud800\ufeff\u202e{\\", id="control-and-surrogates"),
        pytest.param("```json\n{", id="unterminated-fence"),
        pytest.param("```json\n", id="empty-fence"),
        pytest.param("", id="empty"),
        pytest.param("   \n\t", id="blank"),
        pytest.param("NaN Infinity -Infinity [NaN]", id="json-specials"),
    ],
)
def test_hostile_content_never_raises_and_stays_fast(content: str) -> None:
    parsed, stripped = _timed(content)
    assert isinstance(parsed.text, str)
    assert isinstance(stripped, str)
    assert all(call.name in OFFERED for call in parsed.calls)
    assert '"arguments":' not in stripped


def test_three_hundred_calls_return_max_calls_and_post_none() -> None:
    calls = [f'{{"name": "forget_memory", "arguments": {{"memory_id": {n}}}}}' for n in range(1, 301)]
    for content in (
        "\n".join(calls),
        "\n".join(f"```json\n{call}\n```" for call in calls),
        "\n".join(f"<tool_call>{call}</tool_call>" for call in calls),
        "[" + ",".join(calls) + "]",
    ):
        parsed, stripped = _timed("Bye!\n" + content)
        assert [call.arguments for call in parsed.calls] == [{"memory_id": n} for n in range(1, 51)]
        assert parsed.text == "Bye!"
        assert stripped == "Bye!"
        assert len(_parse(content, max_calls=3).calls) == 3
        assert _parse(content, max_calls=0) == ParsedContent(calls=[], text="")


def test_junk_before_a_call_past_the_budget_is_still_never_posted() -> None:
    content = "[]" * 20_000 + SAVE
    parsed, stripped = _timed(content)
    assert stripped == "[]" * 20_000
    assert len(parsed.calls) <= 1


def test_wrong_types_never_raise() -> None:
    assert parse_text_calls(None, OFFERED) == ParsedContent(calls=[], text="")  # type: ignore[arg-type]
    assert parse_text_calls(b"{}", OFFERED) == ParsedContent(calls=[], text="")  # type: ignore[arg-type]
    assert parse_text_calls(SAVE, [None, 3, "save_memory"]).calls[0].name == "save_memory"  # type: ignore[list-item]
    assert strip_tool_json(None) == ""  # type: ignore[arg-type]


_JSONISH = st.lists(st.sampled_from([*'{}[]",:\\ \n`<>/atrue01', "tool_call", '"name"', '"arguments"']), max_size=80).map("".join)
_PIECES = st.sampled_from([SAVE, "```json\n", "```", "<tool_call>", "</tool_call>", "{{", "}}"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_JSONISH, _PIECES), max_size=8))
def test_fuzzed_content_never_raises_and_strip_leaves_no_call(parts: list[str]) -> None:
    content = "".join(parts)
    parsed = _parse(content, max_calls=5)
    assert len(parsed.calls) <= 5
    assert all(call.name in OFFERED for call in parsed.calls)
    stripped = strip_tool_json(content)
    assert _parse(stripped).calls == []
    assert strip_tool_json(parsed.text) == strip_tool_json(parsed.text).strip()


# ---------------------------------------------------------------------------------------------------------
# Lenient argument readers


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("personal", "personal"),
        ("server", "server"),
        (" Personal ", "personal"),
        ("SERVER", "server"),
        (["personal"], "personal"),
        ([" Server"], "server"),
        (["personal", "server"], None),
        ([], None),
        ([["personal"]], None),
        ("private", None),
        ("", None),
        (None, None),
        (1, None),
        ({"list": "personal"}, None),
    ],
)
def test_as_list_name(value: Any, expected: str | None) -> None:
    assert as_list_name(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        ("true", True),
        ("False", False),
        (" YES ", True),
        ("no", False),
        ("1", True),
        ("0", False),
        (1, True),
        (0, False),
        (2, None),
        (-1, None),
        (1.0, None),
        ("maybe", None),
        ("", None),
        (None, None),
        ([True], None),
    ],
)
def test_as_bool(value: Any, expected: bool | None) -> None:
    assert as_bool(value) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("223525073110616", 223525073110616),
        (" 223525073110616 ", 223525073110616),
        (223525073110616, 223525073110616),
        ("<@223525073110616>", 223525073110616),
        ("<@!223525073110616>", 223525073110616),
        ("9223372036854775807", 2**63 - 1),
        ("9223372036854775808", None),
        (2**63, None),
        ("0", None),
        (0, None),
        (-5, None),
        ("1" * 21, None),
        ("1" * 5000, None),
        ("<@0>", None),
        ("<@99999999999999999999>", None),
        (True, None),
        (False, None),
        (1.0, None),
        (223525073110616.0, None),
        ("Juno", "Juno"),
        ("  Juno Park ", "Juno Park"),
        ("@Juno", "@Juno"),
        ("²", "²"),
        ("١٢٣", "١٢٣"),
        ("x" * 100, "x" * 100),
        ("x" * 101, None),
        ("", None),
        ("   ", None),
        (None, None),
        (["123"], None),
    ],
)
def test_as_user_ref(value: Any, expected: int | str | None) -> None:
    result = as_user_ref(value)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (12, 12),
        ("12", 12),
        (" 12 ", 12),
        ("#12", 12),
        ("# 12", 12),
        (2**63 - 1, 2**63 - 1),
        (str(2**63 - 1), 2**63 - 1),
        (2**63, None),
        (str(2**63), None),
        ("²", None),
        ("١٢", None),
        ("1e5", None),
        ("1" * 5000, None),
        ("12.0", None),
        ("+12", None),
        ("-1", None),
        (-1, None),
        (0, None),
        ("0", None),
        ("#", None),
        ("", None),
        (12.0, None),
        (1.5, None),
        (True, None),
        (False, None),
        (None, None),
        ([12], None),
    ],
)
def test_as_memory_id(value: Any, expected: int | None) -> None:
    result = as_memory_id(value)
    assert result == expected
    assert type(result) is type(expected)


def test_echoed_tool_results_are_never_posted() -> None:
    """A small model (0.5B) answered with the tool results it had read; those are not a reply either."""
    assert strip_tool_json('{"ok": true, "memory_id": 1, "forgotten_to_make_room": []}') == ""
    assert strip_tool_json('{"error": "list must be one of: personal, server"} {"error": "x"} Hello') == "Hello"
    assert strip_tool_json('Your config is {"ok": 1, "mode": "fast"} fine') == 'Your config is {"ok": 1, "mode": "fast"} fine'
