"""Trajectory codec, format score, prompt and chat helpers."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jax_drive.text import chat
from jax_drive.text.codec import (format_number, format_point, format_trajectory, parse_trajectories,
                                  parse_trajectory, quantize)
from jax_drive.text.format_score import FormatConfig, format_score, format_scores
from jax_drive.text.prompts import PromptConfig, planning_prompt

SEED_ANSWER = (
    "Here is the planning trajectory [PT, (+2.97, +0.02, 0.0), (+5.82, +0.02, 0.0), "
    "(+8.54, 0.0, -0.03), (+11.17, -0.07, -0.05), (+13.73, -0.22, -0.09), "
    "(+16.21, -0.56, -0.16), (+18.62, -1.10, -0.24), (+20.94, -1.77, -0.28)]."
)
SEED_POSES = np.array(
    [
        [2.97, 0.02, 0.0],
        [5.82, 0.02, 0.0],
        [8.54, 0.0, -0.03],
        [11.17, -0.07, -0.05],
        [13.73, -0.22, -0.09],
        [16.21, -0.56, -0.16],
        [18.62, -1.10, -0.24],
        [20.94, -1.77, -0.28],
    ]
)


def test_format_numbers_match_reference_rules():
    assert format_number(2.9249) == "+2.92"
    assert format_number(-1.1) == "-1.10"
    assert format_number(0.0) == "0.0"
    assert format_number(-0.004) == "0.0"
    assert format_number(0.01) == "0.0"
    assert format_number(-0.0149) == "0.0"
    assert format_number(0.0151) == "+0.02"
    assert format_number(-0.02) == "-0.02"
    assert format_point([0, 0, 0]) == "(0.0, 0.0, 0.0)"
    with pytest.raises(ValueError):
        format_number(float("nan"))


def test_format_seed_answer_exactly():
    assert format_trajectory(SEED_POSES) == SEED_ANSWER


def test_parse_seed_answers():
    parsed = parse_trajectory(SEED_ANSWER)
    assert parsed.ok and parsed.error == ""
    np.testing.assert_array_equal(parsed.poses, SEED_POSES)
    # The seed's first-turn answer writes "+3.1" (one decimal): still accepted.
    cv = "Here is the planning trajectory [PT, " + ", ".join(
        f"(+{v}, 0.0, 0.0)" for v in [3.1, 6.21, 9.31, 12.42, 15.52, 18.62, 21.73, 24.83]
    ) + "]."
    parsed = parse_trajectory(cv)
    assert parsed.ok
    assert parsed.poses[0, 0] == 3.1 and parsed.poses[-1, 0] == 24.83


def test_format_rejects_bad_input():
    with pytest.raises(ValueError):
        format_trajectory(np.zeros((8, 2)))
    with pytest.raises(ValueError):
        format_trajectory(np.full((8, 3), np.inf))


finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False)


@settings(max_examples=100)
@given(st.lists(st.tuples(finite, finite, finite), min_size=8, max_size=8))
def test_round_trip(points):
    points = np.asarray(points)
    parsed = parse_trajectory(format_trajectory(points))
    assert parsed.ok
    expected = np.vectorize(lambda v: 0.0 if abs(round(v, 2)) <= 0.01 else round(v, 2))(points)
    np.testing.assert_array_equal(parsed.poses, expected)
    np.testing.assert_array_equal(parsed.poses, quantize(points))
    assert np.all(np.abs(parsed.poses - points) <= 0.015 + 1e-9)
    # Formatting the parsed value again is a fixed point.
    assert format_trajectory(parsed.poses) == format_trajectory(points)


@settings(max_examples=400)
@given(st.text(max_size=300))
def test_fuzz_arbitrary_text_never_raises(text):
    parsed = parse_trajectory(text)
    assert isinstance(parsed.ok, bool) and isinstance(parsed.error, str)
    assert parsed.ok == (parsed.poses is not None)
    assert format_score(text) in (0.0, 1.0)


_token = st.sampled_from(
    ["[PT,", "[ PT ,", "(", ")", ",", " ", "+1.5", "-0.2", "0.0", "nan", "inf", "1e999", "]", ".",
     "\u2212", "\u0661", "Here is the planning trajectory", "(+1.0, +2.0, 0.0)", "\n"]
)


@settings(max_examples=250)
@given(st.lists(_token, max_size=60))
def test_fuzz_near_miss_text_never_raises(tokens):
    text = "".join(tokens)
    parsed = parse_trajectory(text)
    if parsed.ok:
        assert parsed.poses.shape == (8, 3) and np.all(np.isfinite(parsed.poses))
    else:
        assert parsed.poses is None and parsed.error


@settings(max_examples=100)
@given(st.lists(st.tuples(finite, finite, finite), min_size=8, max_size=8), st.integers(0, 200))
def test_truncation_is_rejected(points, cut):
    text = format_trajectory(np.asarray(points))
    cut = min(cut, len(text) - 1)
    truncated = text[: text.index("]") - cut % (text.index("]") + 1)]
    assert not parse_trajectory(truncated).ok


def _pts(n, values=("+1.00", "0.0", "-0.10")):
    return ", ".join("(" + ", ".join(values) + ")" for _ in range(n))


@pytest.mark.parametrize(
    "text, error",
    [
        (None, "not a string"),
        (b"[PT, (1, 2, 3)]", "not a string"),
        ("", "no [PT block"),
        ("x" * 100_001, "text too long"),
        ("Here is the planning trajectory (+1.0, 0.0, 0.0).", "no [PT block"),
        ("[pt, " + _pts(8) + "]", "no [PT block"),
        ("[PT, " + _pts(8), "unclosed [PT block"),
        ("[PT, " + _pts(8) + " and more]", "malformed block"),
        ("[PT, [" + _pts(8) + "]]", "malformed block"),
        ("[PT, (1.0, 2.0, 3.0), (1.0, 2.0, 3.0]", "malformed block"),
        ("[PT, " + _pts(7) + "]", "expected 8 points, got 7"),
        ("[PT, " + _pts(9) + "]", "expected 8 points, got 9"),
        ("[PT, ]", "expected 8 points, got 0"),
        ("[PT, " + _pts(8, ("1.0", "2.0")) + "]", "point 1: expected 3 values"),
        ("[PT, " + _pts(8, ("1.0", "2.0", "3.0", "4.0")) + "]", "point 1: expected 3 values"),
        ("[PT, " + _pts(8, ("nan", "0.0", "0.0")) + "]", "point 1: bad number"),
        ("[PT, " + _pts(8, ("inf", "0.0", "0.0")) + "]", "point 1: bad number"),
        ("[PT, " + _pts(8, ("\u22121.0", "0.0", "0.0")) + "]", "point 1: bad number"),
        ("[PT, " + _pts(8, ("\u0661.0", "0.0", "0.0")) + "]", "point 1: bad number"),
        ("[PT, " + _pts(8, ("1_0", "0.0", "0.0")) + "]", "point 1: bad number"),
        ("[PT, " + _pts(8, ("", "0.0", "0.0")) + "]", "point 1: bad number"),
        ("[PT, " + _pts(8, ("1e999", "0.0", "0.0")) + "]", "point 1: non-finite value"),
    ],
)
def test_every_documented_rejection(text, error):
    parsed = parse_trajectory(text)
    assert not parsed.ok
    assert parsed.poses is None
    assert parsed.error == error


def test_accepted_variants():
    body = _pts(8)
    for text in [
        "[PT, " + body + "]",  # no sentence, no period
        "blah blah [ PT , " + body + ",] trailing words",  # spaces and trailing comma
        "[PT," + body.replace(" ", "") + "]",
        "Here is the planning trajectory [PT, " + _pts(8, ("1", ".5", "-2e-1")) + "].",
    ]:
        assert parse_trajectory(text).ok, text
    # The last block wins.
    two = format_trajectory(np.zeros((8, 3))) + " Revised: " + format_trajectory(np.ones((8, 3)))
    np.testing.assert_array_equal(parse_trajectory(two).poses, np.ones((8, 3)))


def test_parse_trajectories_batch():
    poses, ok = parse_trajectories([SEED_ANSWER, "garbage", SEED_ANSWER])
    assert poses.shape == (3, 8, 3)
    np.testing.assert_array_equal(ok, [True, False, True])
    np.testing.assert_array_equal(poses[1], 0.0)


def test_format_score():
    assert format_score(SEED_ANSWER) == 1.0
    assert format_score("I cannot answer") == 0.0
    huge = SEED_POSES.copy()
    huge[3, 0] = 500.0
    assert format_score(format_trajectory(huge)) == 0.0
    assert format_score(format_trajectory(huge), FormatConfig(partial_credit=0.25)) == 0.25
    bad_heading = SEED_POSES.copy()
    bad_heading[0, 2] = 4.0
    assert format_score(format_trajectory(bad_heading)) == 0.0
    assert format_score("[PT, " + _pts(8) + "]") == 1.0
    assert format_score("[PT, " + _pts(8) + "]", FormatConfig(require_prefix=True)) == 0.0
    scores = format_scores([SEED_ANSWER, "", None, format_trajectory(huge)])
    assert scores.dtype == np.float32
    np.testing.assert_array_equal(scores, [1.0, 0.0, 0.0, 0.0])


SEED_PROMPT = (
    "<image>\nAs an autonomous driving system, predict the vehicle's trajectory based on:\n"
    "1. Visual perception from front camera view\n"
    "2. Historical motion context (last 4 timesteps): - t-3: (-9.44, +0.02, -0.02) "
    "- t-2: (-6.21, -0.02, 0.0) - t-1: (-3.05, -0.03, 0.0) - t-0: (0.0, 0.0, 0.0)\n"
    "3. Active navigation command: [GO STRAIGHT]\nOutput requirements:\n"
    "- Predict 8 future trajectory points\n- Each point format: (x:float, y:float, heading:float)\n"
    "- Use [PT, ...] to encapsulate the trajectory\n- Maintain numerical precision to 2 decimal places"
)


def _seed_history():
    history = np.zeros((16, 3))
    history[0] = [-9.44, 0.02, -0.02]
    history[5] = [-6.21, -0.02, 0.001]
    history[10] = [-3.05, -0.03, 0.0]
    return history


def test_prompt_matches_seed_appendix():
    assert planning_prompt(_seed_history(), 1) == SEED_PROMPT


def test_prompt_options():
    text_only = planning_prompt(
        _seed_history(), 0, PromptConfig(perception="text", image_placeholder=False), "- a vehicle"
    )
    assert not text_only.startswith("<image>")
    assert "1. Scene description" in text_only and "- a vehicle\n2. Historical" in text_only
    assert "[TURN LEFT]" in text_only
    assert "[UNKNOWN]" in planning_prompt(_seed_history(), 7)
    with pytest.raises(ValueError):
        planning_prompt(_seed_history(), 1, PromptConfig(perception="text"))
    with pytest.raises(ValueError):
        PromptConfig(perception="lidar")
    with pytest.raises(ValueError):
        planning_prompt(np.zeros((4, 3)), 1)


def test_chat_helpers():
    msgs = chat.conversation("prompt", system="sys")
    msgs = chat.add_turn(msgs, "a1", "fb1")
    msgs = chat.add_turn(msgs, "a2")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    prompt, target = chat.split_prompt_target(msgs)
    assert target == "a2" and len(prompt) == 4 and chat.num_turns(msgs) == 2
    with pytest.raises(ValueError):
        chat.validate([{"role": "assistant", "content": "x"}])
    with pytest.raises(ValueError):
        chat.validate([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}])
    with pytest.raises(ValueError):
        chat.message("tool", "x")
    with pytest.raises(ValueError):
        chat.split_prompt_target([{"role": "user", "content": "x"}])


def test_chat_template_renders():
    """The messages render with a real HF chat template (local tokenizer files only)."""
    pytest.importorskip("transformers")
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )
    from transformers.utils.chat_template_utils import render_jinja_template

    msgs = chat.add_turn(chat.conversation(SEED_PROMPT), SEED_ANSWER, "feedback")
    rendered, _ = render_jinja_template(conversations=[msgs], chat_template=template)
    assert rendered[0].count("<|im_start|>") == 3
    assert rendered[0].startswith("<|im_start|>user\n<image>\nAs an autonomous")
