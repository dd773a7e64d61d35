"""Cooperative driving orchestration: the Python side of multi-agent episodes on the
:mod:`jax_drive.sim` core (which never imports this package).

Modules:
  * :mod:`policy`: the policy interface (``DecisionBatch`` -> ``PolicyOutput``).
  * :mod:`episodes`: ``EpisodeBatch``, E episodes in the batched JAX core with a message
    bus each (observe, deliver, send, advance).
  * :mod:`runner`: ``run_episodes`` (termination, metrics, replay records).
  * :mod:`messages`: ``Message``, ``MessageBus`` (radius, one-decision delay, 2 s TTL, bytes).
  * :mod:`replay`: ``Transition`` records with the seed's Eq. 1 weights, batch sampling.
  * :mod:`baselines`: silent and rule-based per-episode policies.
  * :mod:`env`: PettingZoo ``CoopDrivingParallelEnv`` (the environment contract) and the
    Gymnasium ``SingleAgentEnv``.
  * :mod:`evaluate`: seeds x episodes -> metrics with standard errors, tables, JSON.
  * :mod:`render`: a PNG of an episode.

The policy interface, one call per decision for every live agent of every episode::

    class Policy(Protocol):
        name: str
        def decide(self, batch: DecisionBatch) -> PolicyOutput: ...

``DecisionBatch`` (cfg, decision, time, scenario and state of the whole batch as JAX
pytrees, names, episodes, views, buses, agents (N, 2) of (episode, slot); methods
``caption(e, i)``, ``inbox(e, i)``, ``inboxes(e)``) and ``PolicyOutput`` (command and
target_speed (B, A), optional waypoints (B, A, W, 2), messages {episode: [Message]}, info
{(episode, slot): dict} for the replay records). Per-episode policies subclass
``EpisodePolicy`` and implement ``act(view, inboxes) -> (command, target_speed, messages)``.
"""
