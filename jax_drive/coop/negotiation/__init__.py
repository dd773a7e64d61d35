"""CoLMDriver's negotiating drivers on InterDrive: actor-critic language negotiation inside
conflict groups, with intention-guided waypoints.

Modules:
  * :mod:`prompts`: the actor, sum-actions and consensus prompts (``compact`` and ``paper`` styles).
  * :mod:`critic`: the sum-actions and consensus parsers, safety / efficiency scores, feedback.
  * :mod:`negotiate`: ``GroupTalk``, the ``Negotiator`` interface, ``LLMNegotiator`` (one
    engine call per request kind and round, for all groups of all episodes) and the rounds.
  * :mod:`teacher`: the rule-based teacher (the rule-based resolver's yield decisions as
    dialogues; SFT data and an oracle negotiator).
  * :mod:`intention`: the rule-based intention planner, a stand-in for the paper's VLM
    intention planner (we have no camera and no VLM).
  * :mod:`policy`: ``NegotiatingPolicy``, the driving loop (planner -> grouping ->
    negotiation -> intention-guided waypoints) for :func:`jax_drive.coop.runner.run_episodes`.

The grouping itself is pure JAX in :mod:`jax_drive.sim.grouping`.
"""

from jax_drive.coop.negotiation.negotiate import GroupTalk, LLMNegotiator, RecordingNegotiator, RoundsConfig, negotiate
from jax_drive.coop.negotiation.policy import CONTROL_5HZ, NegotiatingPolicy, NegotiationConfig
from jax_drive.coop.negotiation.teacher import RuleTeacher, TeacherConfig

__all__ = ["CONTROL_5HZ", "GroupTalk", "LLMNegotiator", "NegotiatingPolicy", "NegotiationConfig",
           "RecordingNegotiator", "RoundsConfig", "RuleTeacher", "TeacherConfig", "negotiate"]
