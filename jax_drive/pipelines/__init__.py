"""Pipelines: whole experiments built from the library, with their presets beside them.

Modules:
  :mod:`~jax_drive.pipelines.mtdrive`   MTDrive: scenes -> SFT -> RL curation -> mtGRPO -> evaluation
                                         (``run_mtdrive``), resumable stage by stage
  :mod:`~jax_drive.pipelines.mtdrive.presets`   MTDrive presets (``PRESETS``: smoke, cpu-demo, paper)
  :mod:`~jax_drive.pipelines.journal`   the run directory's record of finished stages (resume)
  :mod:`~jax_drive.pipelines.mtdrive.report`    results JSON, printed lines and table
  :mod:`~jax_drive.pipelines.mtdrive.plots`     PDMS per turn, training curves, Fig. 4 refinement
  :mod:`~jax_drive.pipelines.interdrive` CoLMDriver on InterDrive: Table 2 arms, negotiation SFT data,
                                         LoRA fine-tune, Fig. 5 study, dialogue render (presets beside them)
  :mod:`~jax_drive.pipelines.talking_vehicles`  TalkingVehicles / CoopReflect: every Table 1 method,
                                         the distilled policy, Table 3 latency / bytes (``run``)
Nothing is imported here, so importing a sub-module stays as cheap as it can be.
"""
