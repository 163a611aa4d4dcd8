"""The device's preprocessing, one module per stage (see the architecture page's layers).

``pipeline`` builds the device's pipeline from named stages, in order: the boundary with the
ML interfaces and ``qml.snapshots``, the refusals of what PennyLane would differentiate
wrongly, the mid-circuit measurements' bases, the decomposition to the gate set
(``gate_set``), PennyLane's validation, and then the adjoint method's stages (measuring
through the state, the validation of what the sweep differentiates) or the sampling stages.
``config`` holds ``setup_execution_config``'s logic and the device's answer to whether the
adjoint method serves a circuit. The stages' transforms are in ``refusals``, ``mid_circuit``,
``decompose``, ``broadcast``, ``through_state``, ``adjoint``, ``sampled`` and
``interfaces``; ``common`` holds what they share.
"""
