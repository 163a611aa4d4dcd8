"""Adjoint differentiation: what both accumulation modes share (``common``), the eager
sweep (``eager``), the deferred sweep (``deferred``), and Jacobian-vector products
(``jvp``)."""
