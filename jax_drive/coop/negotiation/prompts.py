"""Prompts of CoLMDriver's negotiation (the seed's listings 2-4), in two styles.

Three prompts per round: the actor's message (role, own intention and speed, each other
member's distance, 8-sector direction, 4-bin heading, speed and intention, the traffic
rules, the conversation so far, the critic's feedback; a reply of at most 18 words about
speed trends), the critic's sum-actions request (conversation -> ``{"<id>": {"speed":
"STOP|SLOWER|KEEP|FASTER"}}``) and the consensus request (conversation -> a short analysis
and ``Consensus score: <0-100>``).

Styles (:class:`PromptStyle`):
  * ``paper``: the seed's section structure (role, scenario, traffic rules, task,
    negotiation tips, conversation history, output), written in our words; for large
    models served on a GPU.
  * ``compact``: the same facts in a few lines and only the latest round of the
    conversation (about a third of the tokens); what the fine-tuned SmolLM2 negotiator of
    the CPU demo reads. Each request kind's fixed instructions (the actor's rules and reply
    form, the critic's classes and answer forms) are its system turn and the case (who,
    where, what was said) the user turn, so every prompt of a batched call starts with the
    same tokens: the sampler prefills that common prefix once per call, and a server with
    prefix caching (vLLM's ``--enable-prefix-caching``) once for all calls.

All functions are pure: structured :class:`MemberInfo` in, chat messages out.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from jax_drive.sim.actions import NavIntent, SpeedIntent

PromptStyle = Literal["compact", "paper"]
STYLES = ("compact", "paper")

NAV_TEXT = {
    NavIntent.FOLLOW_LANE: "follow the lane",
    NavIntent.GO_STRAIGHT: "go straight at intersection",
    NavIntent.TURN_LEFT: "turn left at intersection",
    NavIntent.TURN_RIGHT: "turn right at intersection",
    NavIntent.LANE_LEFT: "left lane change",
    NavIntent.LANE_RIGHT: "right lane change",
}
SPEED_NAMES = {SpeedIntent.STOP: "STOP", SpeedIntent.SLOWER: "SLOWER", SpeedIntent.KEEP: "KEEP",
               SpeedIntent.FASTER: "FASTER"}
# Eight sectors of the bearing in the ego frame (0 = ahead, counter-clockwise = left).
DIRECTIONS = ("front", "front-left", "left", "rear-left", "rear", "rear-right", "right", "front-right")
# Four bins of the other vehicle's heading relative to the ego's.
HEADINGS = ("the same way", "to your left", "towards you", "to your right")
MAX_WORDS = 18

# The traffic rules given to every negotiator (the seed's six rules, reworded).
RULES = (
    "Vehicles in an emergency pass first.",
    "A merging car slows down for the car going straight.",
    "A left-turning car slows down for cars going straight or turning right.",
    "The car that is yielded to goes faster.",
    "Cars behind slow down when the car ahead brakes hard.",
    "Following cars keep a safe distance.",
)
COMPACT_RULES = "straight before right turn before left turn before merge or lane change; " \
                "the car yielded to goes faster; keep your distance."


@dataclasses.dataclass(frozen=True)
class MemberInfo:
    """What a group member broadcasts: id, pose, speed and navigation intention.

    Fields: vid (shown id), x, y (m), heading (rad), speed (m/s), nav (:class:`NavIntent`).
    """

    vid: int
    x: float
    y: float
    heading: float
    speed: float
    nav: int


def direction_word(ego: MemberInfo, other: MemberInfo) -> str:
    """Sector (one of :data:`DIRECTIONS`) in which ``other`` lies, seen from ``ego``."""
    bearing = math.atan2(other.y - ego.y, other.x - ego.x) - ego.heading
    return DIRECTIONS[int(round((bearing % (2 * math.pi)) / (math.pi / 4))) % 8]


def heading_word(ego: MemberInfo, other: MemberInfo) -> str:
    """Heading bin (one of :data:`HEADINGS`) of ``other`` relative to ``ego``."""
    rel = (other.heading - ego.heading) % (2 * math.pi)
    return HEADINGS[int(round(rel / (math.pi / 2))) % 4]


def distance(ego: MemberInfo, other: MemberInfo) -> float:
    return math.hypot(other.x - ego.x, other.y - ego.y)


def speaking_order(members: list[MemberInfo]) -> list[int]:
    """Indices of ``members`` by ascending summed distance to the others (ties by position)."""
    sums = [sum(distance(m, o) for o in members) for m in members]
    return sorted(range(len(members)), key=lambda k: (sums[k], k))


def conversation_text(conversation: list[tuple[int, str]], empty: str = "none") -> str:
    """One line per message: ``<vid>: "<text>"``."""
    if not conversation:
        return empty
    return "\n".join(f'{vid}: "{text}"' for vid, text in conversation)


def _others(ego: MemberInfo, others: list[MemberInfo], style: PromptStyle) -> str:
    lines = []
    for o in others:
        d = distance(ego, o)
        if style == "compact":
            lines.append(f"- {o.vid}: {d:.0f} m {direction_word(ego, o)}, heading {heading_word(ego, o)}, "
                         f"{o.speed:.0f} m/s, {NAV_TEXT[NavIntent(o.nav)]}.")
        else:
            lines.append(f"  - Vehicle {o.vid}: {d:.1f} m to your {direction_word(ego, o)}, heading "
                         f"{heading_word(ego, o)}, speed {o.speed:.0f} m/s, intention: {NAV_TEXT[NavIntent(o.nav)]}.")
    return "\n".join(lines)


# The paper style's system turn (short: the sections are in the user turn).
PAPER_SYSTEM = "You are a driving assistant that negotiates with other vehicles."
# The compact style's system turns: everything that does not depend on the case.
COMPACT_ACTOR_SYSTEM = (f"You negotiate speeds between vehicles. Rules: {COMPACT_RULES} "
                        f"Reply in at most {MAX_WORDS} words: I will ...; ...")
COMPACT_SUM_SYSTEM = ("You read a negotiation between vehicles. Classify each vehicle's speed: STOP, SLOWER, KEEP or "
                      "FASTER (yielding: STOP; asking others to yield: FASTER). "
                      'JSON only: {"<id>": {"speed": "<class>"}}')
COMPACT_CONSENSUS_SYSTEM = ("You read a negotiation between vehicles. How far do they agree (0 none, 100 full)? "
                            "Answer: Short analysis: <sentence> Consensus score: <0-100>")


def _chat(system: str, user: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def actor_messages(ego: MemberInfo, others: list[MemberInfo], conversation: list[tuple[int, str]],
                   feedback: list[str], style: PromptStyle = "compact") -> list[dict]:
    """Chat messages asking ``ego`` for its next negotiation message."""
    nav = NAV_TEXT[NavIntent(ego.nav)]
    if style == "compact":
        parts = [f"You are vehicle {ego.vid}: {nav}, {ego.speed:.1f} m/s.", "Others:", _others(ego, others, style),
                 "Last round:", conversation_text(conversation)]
        if feedback:
            parts += ["Critic: " + " ".join(feedback)]
        return _chat(COMPACT_ACTOR_SYSTEM, "\n".join(parts + [f"Reply as {ego.vid}."]))
    rules = "\n".join(f"{k}. {r}" for k, r in enumerate(RULES))
    critic = ("\n\n## Critic feedback\n" + "\n".join(feedback)) if feedback else ""
    parts = [
        f"## Role\nYou drive vehicle {ego.vid}. Several vehicles have conflicting plans; negotiate with them "
        "until you agree, keeping everyone safe and moving.",
        f"## Scenario\n- You (vehicle {ego.vid}): intention {nav}, speed {ego.speed:.1f} m/s\n"
        f"- Other vehicles:\n{_others(ego, others, style)}",
        f"## Traffic rules\n{rules}",
        "## Task\nWeigh every vehicle's speed, direction, distance and intention, find the conflicts and propose "
        "actions that keep all vehicles safe and efficient. Respect the traffic rules, the earlier messages and "
        "the critic's feedback. Either ask others to yield or yield yourself. Your message may state your own "
        "action and requests to other vehicles, both as speed intentions.",
        "## Tips\n- Your action and your requests must fit together; only one side needs to yield.\n"
        "- Name the vehicle each request is for.\n- Talk about speed, not about the route.",
        f"## Conversation so far\n{conversation_text(conversation)}{critic}",
        f"## Output\nYou are vehicle {ego.vid}. Write only your message, at most {MAX_WORDS} words, describing "
        "speed trends without numbers. Form: I will [speed intention]; [request].",
    ]
    return _chat(PAPER_SYSTEM, "\n\n".join(parts))


def sum_actions_messages(vids: list[int], conversation: list[tuple[int, str]],
                         style: PromptStyle = "compact") -> list[dict]:
    """Chat messages asking the critic to classify each member's speed change."""
    ids = ", ".join(str(v) for v in vids)
    if style == "compact":
        return _chat(COMPACT_SUM_SYSTEM, f"Vehicles {ids} said:\n{conversation_text(conversation)}")
    text = (
        "## Task\nSeveral cars negotiated to reach a consensus. Classify each vehicle's speed change as STOP, "
        "SLOWER, KEEP or FASTER and answer with a JSON object mapping each vehicle id to {\"speed\": class}.\n\n"
        "## Classes\n- STOP: come to a standstill.\n- SLOWER: reduce speed.\n- KEEP: hold the current speed.\n"
        "- FASTER: increase speed.\n\n## Extra rules\n- A car that asks others to yield goes faster.\n"
        "- A car that yields to others stops.\n\n"
        f"## Vehicles\n{ids}\n\n## Conversation\n{conversation_text(conversation)}\n\n"
        "Output the JSON object only, with one entry per vehicle, e.g. "
        '{"0": {"speed": "STOP"}, "1": {"speed": "SLOWER"}}.')
    return _chat(PAPER_SYSTEM, text)


def consensus_messages(conversation: list[tuple[int, str]], style: PromptStyle = "compact") -> list[dict]:
    """Chat messages asking the critic how far the group agrees (0-100)."""
    if style == "compact":
        return _chat(COMPACT_CONSENSUS_SYSTEM, f"Last round:\n{conversation_text(conversation)}")
    text = (
        "## Task\nRead the conversation and judge whether the vehicles reached a consensus. Give a very short "
        "explanation, then a score from 0 (no consensus at all) to 100 (complete consensus).\n\n"
        "## Scale\n0-20: strong disagreement, almost nothing shared.\n21-40: mostly disagreement, one or two "
        "accepted points.\n41-60: partial compromise, important disagreements left.\n61-80: agreement on most "
        "points, small differences left.\n81-100: agreement on nearly everything.\n\n"
        "## Situation\nCars on the road may be about to conflict; they negotiate to avoid it.\n\n"
        f"## Conversation\n{conversation_text(conversation)}\n\n"
        "## Output format\nShort analysis: <one short sentence>\nConsensus score: <int>")
    return _chat(PAPER_SYSTEM, text)
