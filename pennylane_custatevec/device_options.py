"""The device's constructor options checked, each refusal naming the option and its
choices; the random generator a ``seed`` gives.
"""

from __future__ import annotations

import numpy as np

from .backends import BACKEND_CHOICES

_DTYPE_CHOICES = (np.complex128, np.complex64)


class UnknownOptionError(ValueError, TypeError):
    """A keyword the device does not take (a TypeError for Python, a ValueError for users)."""


GLOBAL_SEED_HIGH = 10_000_000
"""``seed="global"`` draws ``numpy.random.randint(0, high=GLOBAL_SEED_HIGH)``: default.qubit's
draw, so that a script's later ``numpy.random`` values do not depend on the device it builds."""


_SEED_CHOICES = (
    "use an int >= 0 (or a sequence of them), None (a seed from the OS), 'global' (a seed "
    "drawn from numpy's global random state), a numpy.random.Generator (or a SeedSequence "
    "or BitGenerator), or a jax PRNG key"
)


def rng_from_seed(seed) -> np.random.Generator:
    """The device's Generator for ``seed``, which is checked first (numpy's own messages do
    not name the option)."""
    if isinstance(seed, str):
        if seed != "global":
            raise ValueError(f"seed={seed!r} is not valid; {_SEED_CHOICES}.")
        return np.random.default_rng(np.random.randint(0, high=GLOBAL_SEED_HIGH))
    if seed is None or isinstance(
        seed, (np.random.Generator, np.random.SeedSequence, np.random.BitGenerator)
    ):
        return np.random.default_rng(seed)
    key_words = jax_key_words(seed)
    if key_words is not None:
        seed = key_words
    if not (_is_natural(seed) or _is_natural_sequence(seed)):
        raise ValueError(f"seed={seed!r} is not valid; {_SEED_CHOICES}.")
    return np.random.default_rng(seed)


def jax_key_words(seed) -> list[int] | None:
    """The words of a jax PRNG key (``jax.random.PRNGKey``'s uint32 array or a typed
    ``jax.random.key``), numpy's entropy for it, or None where ``seed`` is not a jax array
    (jax is imported only for one). default.qubit samples with jax under such a key: the
    same key gives the same samples here (on every execution, as there), not
    default.qubit's."""
    if not type(seed).__module__.startswith(("jax", "jaxlib")):
        return None
    import jax  # noqa: PLC0415 - only for a seed that is a jax array

    if jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
        seed = jax.random.key_data(seed)
    if isinstance(seed, jax.core.Tracer):
        # a device built inside jax.jit from a traced key (default.qubit samples with jax
        # there); its words exist only when the compiled function runs
        raise ValueError(
            "seed is a jax PRNG key traced by jax.jit: custatevec.qubit samples on the host "
            "and needs the key's words when the device is built. Build the device outside "
            "the jitted function (a concrete key, or an int seed), or pass the key to "
            f"default.qubit; otherwise {_SEED_CHOICES}."
        )
    return np.asarray(seed).ravel().tolist()


def _is_natural(value) -> bool:
    """An int >= 0 (numpy's entropy), not a bool."""
    return (
        isinstance(value, (int, np.integer))
        and not isinstance(value, (bool, np.bool_))
        and value >= 0
    )


def _is_natural_sequence(value) -> bool:
    """A non-empty flat sequence (list, tuple, 1-d array) of ints >= 0."""
    if isinstance(value, np.ndarray):
        value = value.tolist() if value.ndim == 1 else None
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(map(_is_natural, value))


def validated_dtype(c_dtype) -> np.dtype:
    """``c_dtype`` as a numpy dtype, one of ``_DTYPE_CHOICES``."""
    message = f"c_dtype={c_dtype!r} is not supported; choose numpy.complex128 or numpy.complex64."
    try:
        dtype = np.dtype(c_dtype)
    except TypeError:
        raise ValueError(message) from None
    if dtype not in {np.dtype(d) for d in _DTYPE_CHOICES}:
        raise ValueError(message)
    return dtype


def validate_wires(wires) -> None:
    """A number of wires must be an int >= 0: PennyLane takes ``range(-1)`` (no wires) and
    fails on a float with Python's message, which names neither the option nor the choices.
    No wires (``0`` or ``[]``) is a device that takes each circuit's wires, as with None
    (default.qubit's behaviour)."""
    choices = (
        "use a number of wires (an int >= 0), an iterable of wire labels (ints, strings, any "
        "hashable), or None (the wires of each circuit)"
    )
    if isinstance(wires, (bool, float, complex, np.bool_, np.floating, np.complexfloating)):
        raise ValueError(f"wires={wires!r} is not valid; {choices}.")
    if isinstance(wires, (int, np.integer)) and wires < 0:
        raise ValueError(f"wires={wires!r} is not valid: a negative number of wires; {choices}.")


def check_placement(backend: str, device_id, mpi, mpi_gather) -> None:
    """``backend``, ``device_id`` and ``mpi_gather`` (with ``mpi``) checked."""
    if backend not in BACKEND_CHOICES:
        raise ValueError(
            f"backend={backend!r} is not valid; choose one of {', '.join(BACKEND_CHOICES)}."
        )
    if device_id is not None and (
        isinstance(device_id, bool) or not isinstance(device_id, (int, np.integer)) or device_id < 0
    ):
        raise ValueError(
            f"device_id={device_id!r} is not valid; use a GPU index (0, 1, ...) or None "
            "(LOCAL_RANK if set, else the current CUDA device)."
        )
    if not isinstance(mpi_gather, (bool, np.bool_)):
        raise ValueError(
            f"mpi_gather={mpi_gather!r} is not valid; use True (state() and probs() "
            "whole on every rank) or False (each rank's share)."
        )
    if mpi is False and not mpi_gather:
        raise ValueError("mpi_gather=False needs mpi=True (it says what each rank returns).")
