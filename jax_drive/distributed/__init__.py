"""Scenario workers as Ray actors: episodes that survive dead workers, recorded exactly once.

Modules (import them directly; this package imports neither Ray nor JAX):
  * :mod:`episodes`: ``EpisodeSpec`` (one episode: scenario, seed, index, configuration;
    its stable ``id``), ``plan_episodes`` and the JSON episode records.
  * :mod:`store`: ``ResultStore``, an on-disk, idempotent result store (one file per
    episode id, written atomically, first write wins; a journal of every event) that a
    restarted driver resumes from.
  * :mod:`backends`: what a worker runs: ``JaxBackend`` (a batch of episodes on the JAX
    core) and ``CarlaBackend`` (one CARLA world, :mod:`jax_drive.carla`).
  * :mod:`worker`: ``ScenarioWorker``, the actor class (``ping``, ``status``, ``run``).
  * :mod:`pool`: ``ScenarioPool``: schedules episode chunks on workers, checks their
    health, lets Ray restart dead actors (``max_restarts``), retries the episodes of a
    worker that died and records every result once; ``init_ray`` (local by default).

Semantics. Ray gives at-most-once actor calls by default (``max_task_retries=0``): a call in
flight when its process dies raises ``RayActorError`` even if it ran. The pool re-queues the
episodes of such a call, so each episode runs at least once; the store keeps the first result
per episode id, so each is recorded exactly once. Episodes are deterministic functions of
their spec (the JAX key is ``fold_in(key(seed), index)``, as in
:func:`jax_drive.coop.evaluate.evaluate`), so a retried episode gives the same result.
"""
