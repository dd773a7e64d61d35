"""The CARLA backend of the cooperative-driving environment contract.

The contract is :class:`jax_drive.coop.env.CoopDrivingParallelEnv` (PettingZoo) over the
:class:`jax_drive.coop.episodes.EpisodeBatch` interface; this package implements the batch
over a CARLA 0.9.x server, so the runner, the PettingZoo environment, the policies, the
captioner, the message bus and the metrics are the same code for both backends.

Modules:
  * :mod:`frames`: our right-handed scenario frame <-> CARLA's left-handed world (yaw in
    degrees), placed by an :class:`~frames.Anchor`.
  * :mod:`routes`: leaderboard route XML (read and write; InterDrive's one file per ego).
  * :mod:`sites`: where each scenario goes on Towns 05/06/07, and :class:`~sites.TownBuilder`,
    which rebuilds a scenario definition on the town's traced lanes.
  * :mod:`spawn`: spawn specifications (blueprint, transform, who drives) from a scenario.
  * :mod:`world`: :class:`~world.CarlaWorld`, one server session: synchronous mode at
    1/dt Hz, a Traffic Manager on its own port, actors, controls, lights, read-back.
  * :mod:`env`: :class:`~env.CarlaEpisodeBatch` and :class:`~env.CarlaParallelEnv` (the
    Ray worker's runner, :class:`jax_drive.distributed.backends.CarlaRunner`, uses them).
  * :mod:`server`: CARLA server processes: port allocation, command lines, readiness,
    process-group shutdown, a health state machine and a restarting pool.

``import carla`` (the optional ``carla`` extra: the 0.9.16 client wheel) happens only in
:func:`carla_module`, so everything that needs no server imports without it.
"""

from __future__ import annotations


def carla_module():
    """The ``carla`` client module, imported on first use."""
    try:
        import carla
    except ImportError as error:  # pragma: no cover - depends on the optional extra
        raise ImportError("the CARLA client is not installed: pip install 'jax-drive[carla]' "
                          "(carla==0.9.16, Python 3.10-3.12)") from error
    return carla
