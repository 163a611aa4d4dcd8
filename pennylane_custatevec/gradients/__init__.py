"""Adjoint differentiation: what both accumulation modes share (``validation``,
``differentiated``: the tape and its layout, ``observables``: observable-data derivatives,
``results``, ``cotangents``, ``bras``: the bras' cotangent terms, ``memory``: sweep memory,
``forward``: forward-mode derivatives), the eager sweep (``eager``), the deferred mode
(``deferred``: its scheduling; ``fused_sweep``: its sweep over fused blocks), and
Jacobian-vector products (``jvp``)."""
