"""The compiled torch path: ``compile(qnode)`` runs a QNode on ``custatevec.qubit`` as one
``torch.autograd.Function`` per call (``qnode``), its gate parameters replayed as torch
expressions of the arguments (``trace``), its backward the device's adjoint VJP
(``function``). See ``doc/compiled.md``."""

from .qnode import CompiledQNode, compile

__all__ = ["CompiledQNode", "compile"]
