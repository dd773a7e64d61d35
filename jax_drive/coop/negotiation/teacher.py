"""Rule-based teacher: the rule-based resolver's yield decisions as negotiation text.

Answers the three negotiation requests without a language model, from the episode view
a :class:`~jax_drive.coop.negotiation.negotiate.GroupTalk` carries:

* who yields: for every member pair the rule-based baseline's
  (:class:`~jax_drive.coop.baselines.RuleBasedPolicy`) prediction and right of way
  (straight before right turns before left turns before lane changes; then who reaches the
  conflict first); a pair the grouping or the critic flags but the rules see no conflict
  in, or where both or neither would yield, is settled by that manoeuvre order, then by
  the higher id yielding. A member that yields stops (conflict within 4.5 s or nearly
  stopped) or slows down; a member yielded to goes faster; the others keep their speed.
  If everyone ends up yielding (a cycle), the lowest id goes.
* messages: short sentences in the seed's "I will [speed intention]; [request]." form
  ("I will stop; 202 go faster."), several phrasings picked at random;
* sum actions: the JSON of the speed intentions stated in the last round;
* consensus: a short analysis and a score from the share of conflicting pairs where
  exactly one side yields to the other (25 when none, 95 when all; 90 without conflicts).

Later rounds follow the critic: for a pair named in a safety line, a yielder that slowed
down stops; one that already stopped swaps roles with the other side (it may already be in
the way); in the third round both stop. Those changes hold for the rest of the
negotiation. After efficiency feedback alone, the other yielders that are still moving
slow down instead of stopping and those keeping their speed go faster.
``corrupt_prob`` > 0 makes the first round of that share of groups deliberately wrong
(everyone insists on passing, or everyone yields), so that SFT data also holds bad
conversations, their summed actions and low consensus scores, and the recovery after the
critic's feedback. It is 0 when the teacher is evaluated as a negotiator.

This is the data source of the small-model path (SFT of SmolLM2) and a cheap oracle
negotiator for checking the driving loop.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np

from jax_drive.coop.baselines import RuleBasedPolicy
from jax_drive.coop.negotiation.prompts import SPEED_NAMES
from jax_drive.sim.actions import SPEED_CAP, NavIntent, SpeedIntent

STOP_WITHIN = 4.5  # s: a yielder this close to the conflict stops rather than slows

YIELD_STOP = ("I will stop; {j} go faster.", "I will stop and yield; {j} go faster.",
              "I will stop for {j}; {j} can go faster.")
YIELD_SLOW = ("I will slow down; {j} go faster.", "I will slow down and yield; {j} go faster.")
PASS = ("I will go faster; {y} please {req}.", "I will go first and faster; {y} {req} please.")
KEEP = ("I will keep speed; no conflict with {o}.", "I will keep my speed; {o} no need to yield.")
ANALYSIS = {"all": "Everyone agrees who yields.", "none": "They disagree on who goes first.",
            "some": "They agree on part of the plan.", "free": "No conflict; everyone keeps going."}


# The first cue word of a reply's "I will ..." clause decides (so "slow down and yield" slows):
# these words exactly, or any word these stems start ("stopping", "slowing", "keeps").
_CUE_WORDS = {"go": "FASTER", "going": "FASTER", "first": "FASTER", "faster": "FASTER"}
_CUE_STEMS = {"stop": "STOP", "wait": "STOP", "yield": "STOP", "slow": "SLOWER", "keep": "KEEP"}


def stated_speed(text) -> str | None:
    """The speed intention an actor reply states for its own speaker, as a sum-actions class
    ('STOP', 'SLOWER', 'KEEP', 'FASTER'), read from its "I will ..." clause (the teacher's
    phrasings and their close variants); None when the reply states none.

    "I will stop and yield; 202 go faster." -> 'STOP'; "I will go first and faster; ..." ->
    'FASTER'; "202 go faster." -> None."""
    if not isinstance(text, str):
        return None
    clause = re.search(r"\bi will ([^;,.:!?]*)", text.lower())
    if clause is None:
        return None
    for word in re.findall(r"[a-z]+", clause.group(1)):
        if word in _CUE_WORDS:
            return _CUE_WORDS[word]
        stem = next((stem for stem in _CUE_STEMS if word.startswith(stem)), None)
        if stem is not None:
            return _CUE_STEMS[stem]
    return None


def _ids(vids) -> str:
    vids = [str(v) for v in vids]
    return vids[0] if len(vids) == 1 else ", ".join(vids[:-1]) + " and " + vids[-1]


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
    """corrupt_prob: share of groups with a deliberately wrong first round (SFT data);
    seed: phrasing / corruption randomness."""

    corrupt_prob: float = 0.0
    seed: int = 0


class RuleTeacher:
    """The rule-based teacher (see the module docstring); a :class:`Negotiator`."""

    name = "rule_teacher"

    def __init__(self, cfg: TeacherConfig = TeacherConfig()):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.rules = RuleBasedPolicy()

    # ------------------------------------------------------------------ resolution
    def _paths(self, g):
        view, out = g.view, []
        for slot, info in zip(g.slots, g.infos):
            me = self.rules._from_view(view, slot, lane_known=True)
            lane = int(view["lane"][slot])
            if info.nav in (NavIntent.LANE_LEFT, NavIntent.LANE_RIGHT):
                side = view["lane_left"] if info.nav == NavIntent.LANE_LEFT else view["lane_right"]
                lane = int(side[lane]) if side[lane] >= 0 else lane
                me.maneuver = 3
            else:
                me.maneuver = int(view["lane_maneuver"][lane])
            me.lane, me.cooperative = lane, True
            plan = max(float(view["speed"][slot]), min(float(view["cruise_speed"][slot]), SPEED_CAP), 3.0)
            out.append((me, self.rules.predict(view, me, plan)))
        return out

    def resolve(self, g, flagged=()) -> dict[int, tuple[int, list[int]]]:
        """vid -> (speed intention, vids it yields to), from the rules (see module doc)."""
        paths = self._paths(g)
        n = len(g.vids)
        yields = {v: {} for v in g.vids}  # vid -> {other vid: time to conflict}
        pairs = {tuple(sorted(e)) for e in list(g.edges) + list(flagged)}
        for a in range(n):
            for b in range(a + 1, n):
                (ma, pa), (mb, pb) = paths[a], paths[b]
                ya, ta = self.rules.yields_to(g.view, g.slots[a], ma, mb, pa, pb)
                yb, tb = self.rules.yields_to(g.view, g.slots[b], mb, ma, pb, pa)
                va, vb = g.vids[a], g.vids[b]
                if not (ya or yb or (min(va, vb), max(va, vb)) in pairs):
                    continue
                t = min(ta, tb) if np.isfinite(min(ta, tb)) else 2.0
                if ya != yb:
                    loser = va if ya else vb
                elif ma.maneuver != mb.maneuver:
                    loser = va if ma.maneuver > mb.maneuver else vb
                else:
                    loser = max(va, vb)
                yields[loser][vb if loser == va else va] = t
        if n > 1 and all(yields[v] for v in g.vids):  # a cycle: the lowest id goes
            yields[min(g.vids)] = {}
        out = {}
        for v in g.vids:
            if yields[v]:
                stop = min(yields[v].values()) < STOP_WITHIN or g.speeds[v] < 1.0
                out[v] = (int(SpeedIntent.STOP if stop else SpeedIntent.SLOWER), sorted(yields[v]))
            elif any(v in yields[o] for o in g.vids):
                out[v] = (int(SpeedIntent.FASTER), [])
            else:
                out[v] = (int(SpeedIntent.KEEP), [])
        return out

    def _plan(self, g) -> dict:
        """This round's stated intentions (vid -> (intent, yields_to)), kept in ``g.scratch``."""
        r = len(g.rounds)
        key = f"plan{r}"
        if key in g.scratch:
            return g.scratch[key]
        if r == 0 and "corrupt" not in g.scratch:
            g.scratch["corrupt"] = (self.rng.choice(["stubborn", "timid"])
                                    if self.rng.uniform() < self.cfg.corrupt_prob else "")
        flagged = [(int(k.split("-")[0]), int(k.split("-")[1])) for k, s in
                   (g.rounds[-1].get("pair_safety", {}).items() if g.rounds else []) if s < 0.7]
        plan = self.resolve(g, flagged if g.feedback else ())
        # Members a safety line made change keep that change for the rest of the negotiation:
        # re-resolving from the rules alone would state the criticised plan again.
        held = g.scratch.setdefault("held", {})
        if r == 0 and g.scratch["corrupt"] == "stubborn":
            plan = {v: (int(SpeedIntent.FASTER), []) for v in g.vids}
        elif r == 0 and g.scratch["corrupt"] == "timid":
            plan = {v: (int(SpeedIntent.STOP), [o for o in g.vids if o != v]) for v in g.vids}
        elif flagged and g.feedback:
            plan = self._after_safety_feedback(g, {**plan, **held}, flagged, r)
            held.update({v: plan[v] for pair in flagged for v in pair if v in plan})
        elif any(f.startswith("Efficiency") for f in g.feedback):  # yielders far from the conflict slow only
            plan = {v: held[v] if v in held else
                    (int(SpeedIntent.SLOWER) if (i == SpeedIntent.STOP and y and g.speeds[v] >= 1.0) else
                     int(SpeedIntent.FASTER) if i == SpeedIntent.KEEP else i, y) for v, (i, y) in plan.items()}
        g.scratch[key] = plan
        g.scratch["spoken"] = key
        return plan

    def _after_safety_feedback(self, g, plan, flagged, r):
        """A pair the critic still flags: a slowing yielder stops; a yielder that already
        stopped swaps roles with the other side (it may be in the way already); in the
        last round both stop."""
        before = g.scratch[f"plan{r - 1}"] if f"plan{r - 1}" in g.scratch else plan
        plan = dict(plan)
        for a, b in flagged:
            if a not in plan or b not in plan:
                continue
            if r >= 2:
                plan[a] = (int(SpeedIntent.STOP), sorted(set(plan[a][1]) | {b}))
                plan[b] = (int(SpeedIntent.STOP), sorted(set(plan[b][1]) | {a}))
                continue
            yielder = a if b in before[a][1] else b if a in before[b][1] else max(a, b)
            other = b if yielder == a else a
            if before[yielder][0] == SpeedIntent.STOP:
                plan[yielder] = (int(SpeedIntent.FASTER), [])
                plan[other] = (int(SpeedIntent.STOP), sorted(set(plan[other][1]) | {yielder}))
            else:
                plan[yielder] = (int(SpeedIntent.STOP), sorted(set(plan[yielder][1]) | {other}))
        return plan

    @staticmethod
    def deliberately_wrong(g) -> bool:
        """Whether the answers this teacher gives ``g`` now are deliberately wrong (a corrupted
        first round, see the module docstring): SFT must not teach an actor to say them."""
        return len(g.rounds) == 0 and bool(g.scratch.get("corrupt"))

    @staticmethod
    def _stated(g) -> dict:
        """The intentions stated in the last round spoken."""
        return g.scratch[g.scratch["spoken"]]

    def _text(self, g, v, plan) -> str:
        intent, yields_to = plan[v]
        others = [o for o in g.vids if o != v]
        pick = lambda options: options[int(self.rng.integers(len(options)))]  # noqa: E731
        if intent in (SpeedIntent.STOP, SpeedIntent.SLOWER):
            return pick(YIELD_STOP if intent == SpeedIntent.STOP else YIELD_SLOW).format(j=_ids(yields_to or others))
        if intent == SpeedIntent.FASTER:
            yielders = [o for o in others if v in plan[o][1]] or others
            req = "stop" if all(plan[o][0] == SpeedIntent.STOP for o in yielders if o in plan) else "slow down"
            if g.scratch.get("corrupt") == "stubborn" and len(g.rounds) == 0:
                req = "yield"
            return pick(PASS).format(y=_ids(yielders), req=req)
        return pick(KEEP).format(o=_ids(others))

    # ------------------------------------------------------------------ Negotiator
    def speak(self, requests):
        return [self._text(g, g.vids[k], self._plan(g)) for g, k, _ in requests]

    def sum_actions(self, groups):
        out = []
        for g in groups:
            plan = self._stated(g)
            out.append(json.dumps({str(v): {"speed": SPEED_NAMES[SpeedIntent(plan[v][0])]} for v in g.vids}))
        return out

    def consensus(self, groups):
        out = []
        for g in groups:
            plan = self._stated(g)
            pairs = {tuple(sorted(e)) for e in g.edges}
            pairs |= {tuple(sorted((v, o))) for v, (_, y) in plan.items() for o in y}
            agreed = sum((b in plan[a][1]) != (a in plan[b][1]) for a, b in pairs)  # one side yields
            out.append(consensus_answer(agreed, len(pairs)))
        return out


def consensus_answer(agreed: int, pairs: int) -> str:
    """The rule critics' consensus answer: 90 without a conflicting pair, else ``25 + 70 x``
    the share of pairs settled with exactly one side yielding."""
    if not pairs:
        return f"Short analysis: {ANALYSIS['free']} Consensus score: 90"
    which = "all" if agreed == pairs else "none" if agreed == 0 else "some"
    return f"Short analysis: {ANALYSIS[which]} Consensus score: {int(round(25 + 70 * agreed / pairs))}"


class StatedIntentCritic:
    """A rule critic that judges what the actors SAID: the sum of a round is each member's
    intention as its reply states it (:func:`stated_speed`; a member that states none keeps its
    current one), and the consensus counts the group's conflicting pairs in which exactly one
    side states a yield (STOP or SLOWER), on the teacher's scale (:func:`consensus_answer`).
    Deterministic and independent of any model: a fixed reward giver for training an actor
    (:mod:`jax_drive.coop.negotiation.rl`) when the language-model critic cannot judge."""

    name = "stated-intent critic"

    @staticmethod
    def _stated(g) -> dict:
        return {v: stated_speed(text) for v, text in g.last_round()}

    def speak(self, requests):
        raise TypeError("the stated-intent critic judges replies; it does not speak")

    def sum_actions(self, groups):
        return [json.dumps({str(v): {"speed": said} for v, said in self._stated(g).items() if said is not None})
                for g in groups]

    def consensus(self, groups):
        out = []
        for g in groups:
            pairs = {tuple(sorted(e)) for e in g.edges}
            out.append(consensus_answer(stated_settled_pairs(dict(g.last_round()), pairs), len(pairs)))
        return out


def stated_settled_pairs(replies: dict[int, str], pairs) -> int:
    """How many of the conflicting ``pairs`` (vid, vid) a round's ``replies`` ({vid: text})
    settle: exactly one side states a yield (STOP or SLOWER, :func:`stated_speed`; a vehicle
    without a reply or a stated intention does not yield)."""
    yields = {v: stated_speed(text) in ("STOP", "SLOWER") for v, text in replies.items()}
    return sum(yields.get(a, False) != yields.get(b, False) for a, b in pairs)
