"""Pipelines: whole experiments as data, each an ordered tuple of named stages with its presets.

Modules:
  :mod:`~jax_drive.pipelines.stages`      the skeleton: ``Stage``, the immutable ``RunContext``,
                                          the ``Workspace`` of mutable resources, ``run_stages``
  :mod:`~jax_drive.pipelines.journal`     records of finished stages (``RunJournal``: run.json +
                                          stages/; ``FileJournal``: one JSON per stage), so runs resume
  :mod:`~jax_drive.pipelines.engines`     the one engine factory (``ModelSpec``, ``EngineSpec``)
  :mod:`~jax_drive.pipelines.mtdrive`     MTDrive: scenes -> SFT -> RL curation -> mtGRPO -> evaluation
  :mod:`~jax_drive.pipelines.talking_vehicles`  TalkingVehicles / CoopReflect: Table 1 methods (a
                                          registry), the distilled policy, Table 3 latency / bytes
  :mod:`~jax_drive.pipelines.interdrive`  CoLMDriver on InterDrive: Table 2 arms, the negotiator's
                                          SFT, Fig. 5, a dialogue render
Nothing is imported here, so importing a sub-module stays as cheap as it can be.
"""
