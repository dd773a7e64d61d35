"""extract_json_object: the JSON answers of language agents, on friendly and hostile text."""

import json

from hypothesis import given, strategies as st

from jax_drive.text.json_answer import MAX_TEXT_CHARS, extract_json_object


def test_plain_object():
    r = extract_json_object('{"command": "stop", "message": ""}')
    assert r.ok and r.value == {"command": "stop", "message": ""} and r.error is None


def test_prose_and_code_fence_around_the_object():
    text = 'Sure! Here is my decision:\n```json\n{"command": "slow down", "message": "yielding {you}"}\n```\nDone.'
    assert extract_json_object(text).value == {"command": "slow down", "message": "yielding {you}"}


def test_braces_and_escaped_quotes_inside_strings():
    obj = {"message": 'he said "}{" then left \\ ok', "command": "go"}
    assert extract_json_object("x " + json.dumps(obj) + " y").value == obj


def test_trailing_commas_are_forgiven():
    assert extract_json_object('{"a": [1, 2,], "b": {"c": 3,},}').value == {"a": [1, 2], "b": {"c": 3}}


def test_first_parsable_object_wins():
    text = '{not json} then {"command": "stop"} and {"command": "go"}'
    assert extract_json_object(text).value == {"command": "stop"}


def test_typed_failures():
    assert extract_json_object(None).error == "not a string"
    assert extract_json_object("x" * (MAX_TEXT_CHARS + 1)).error == "text too long"
    assert extract_json_object("no braces here").error == "no JSON object"
    assert extract_json_object('{"command": "stop"').error == "unclosed JSON object"
    assert extract_json_object("{'single': quotes}").error == "malformed JSON object"
    assert extract_json_object("[1, 2, 3]").error == "no JSON object"  # a list is not an object


@given(st.text(max_size=300))
def test_never_raises_on_any_text(text):
    r = extract_json_object(text)
    assert r.ok == (r.error is None)
    assert r.value is None or isinstance(r.value, dict)


@given(st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=12), st.booleans()), max_size=4),
       st.text(alphabet="abc .:\n", max_size=20), st.text(alphabet="abc .:\n", max_size=20))
def test_recovers_any_object_wrapped_in_prose(obj, before, after):
    assert extract_json_object(before + json.dumps(obj) + after).value == obj
