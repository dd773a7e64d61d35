"""Multi-agent cooperative driving simulator core: pure, jittable and backend-neutral
(TalkingVehicles and InterDrive scenarios).

* :mod:`state`: the pytrees (``SimConfig``, ``Scenario``, ``SimState``, ``Action``) and enums.
* :mod:`core`: batched jitted physics (``reset``, ``step``, ``rollout``, ``batched_*``).
* :mod:`scenarios`: the scenario library as data (``build(name, key, ...)``).
* :mod:`lanes`: lane-path building for the scenario builders (NumPy).
* :mod:`actions`: CoLMDriver intentions -> waypoints, command actions.
* :mod:`observe`: visibility, the per-decision batch observation, structured arrays,
  NumPy views of an episode and the text captioner.
* :mod:`metrics`: outcomes and CR/SR/TR, DS/RC/IS/SR from final states.

Geometry (boxes, polyline projection) comes from :mod:`jax_drive.geometry`. The
Python-side orchestration (runner, message bus, policies, replay, environments,
evaluation, rendering) lives one layer up in :mod:`jax_drive.coop`; nothing here imports it.
"""

from jax_drive.sim.state import Action, Behaviour, Cmd, Role, Scenario, SimConfig, SimState

__all__ = ["Action", "Behaviour", "Cmd", "Role", "Scenario", "SimConfig", "SimState"]
