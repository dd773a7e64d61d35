"""Multi-agent cooperative driving simulator in JAX (TalkingVehicles and InterDrive
scenarios): batched jitted physics (:mod:`core`), scenario library (:mod:`scenarios`),
observations and captioner (:mod:`observe`), message bus (:mod:`messages`), metrics
(:mod:`metrics`), replay records (:mod:`replay`), baselines (:mod:`baselines`), the
episode runner (:mod:`runner`), PettingZoo / Gymnasium APIs (:mod:`env`) and rendering
(:mod:`render`)."""

from jax_drive.sim.state import Action, Behaviour, Cmd, Role, Scenario, SimConfig, SimState

__all__ = ["Action", "Behaviour", "Cmd", "Role", "Scenario", "SimConfig", "SimState"]
