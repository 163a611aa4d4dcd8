"""The random generators a trace watches, so that a replay draws exactly what the quantum
function would draw.

A quantum function may draw random numbers with torch (``torch.rand(())``, ``torch.randn_like(x)``,
``torch.bernoulli(p, generator=g)``, dropout, ...). A trace records such a call as a node
that every replay runs again, so that each call draws anew from the same generators, in
the same order, as the QNode would. Whether a torch call draws is not read from its name:
the watch compares the states of the generators before and after every torch call of the
trace (torch's default CPU generator, the default CUDA generators once CUDA is
initialised, and every ``torch.Generator`` passed to a call), so a random function of any
name is recorded as one.

A generator whose state changes *between* torch calls was changed by code that torch does
not report (``torch.manual_seed``, ``Generator.manual_seed``, ``set_rng_state`` inside the
quantum function): a replay would not repeat that change, so the trace is refused.

The watch also keeps every generator's state from the trace's start, so that the traced
call itself can be run by a replay that draws the trace's own numbers again (``rewind``),
and a refused trace leaves the generators, numpy's global generator and Python's
``random`` as they were before it, for the recording that then runs the quantum function
(``rewind_everything``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import torch


class GeneratorChanged(Exception):
    """A generator's state changed outside torch's functions; the message says which."""


def _state(generator: torch.Generator) -> bytes:
    with torch._C._DisableFuncTorch():  # under torch.func's transforms, a plain tensor
        return generator.get_state().numpy().tobytes()


def _defaults() -> list[torch.Generator]:
    generators = [torch.default_generator]
    if torch.cuda.is_initialized():
        generators.extend(torch.cuda.default_generators)
    return generators


def generators_in(args: tuple, kwargs: dict) -> list[torch.Generator]:
    """The ``torch.Generator`` objects a torch call takes (torch's functions take them as
    arguments of their own, ``generator=``, never nested in a sequence)."""
    return [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Generator)]


def restore(states) -> None:
    """Generators back to the states of ``(generator, state)`` pairs."""
    with torch._C._DisableFuncTorch():
        for generator, state in states:
            generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


class GeneratorWatch:
    """The states of the watched generators: at the trace's start and as the last torch
    call left them (module docstring)."""

    def __init__(self, known: Sequence[torch.Generator] = ()):
        self._start: dict[int, tuple[torch.Generator, bytes]] = {}
        self._expected: dict[int, bytes] = {}
        for generator in (*_defaults(), *known):
            self.watch(generator)
        self._numpy_start = np.random.get_state()
        self._python_start = random.getstate()

    def watch(self, generator: torch.Generator) -> None:
        """Watch ``generator`` from now on (its state now counts as its start)."""
        if id(generator) not in self._start:
            state = _state(generator)
            self._start[id(generator)] = (generator, state)
            self._expected[id(generator)] = state

    @property
    def explicit(self) -> tuple[torch.Generator, ...]:
        """The watched generators other than torch's defaults: the next trace of the key
        watches them from its start."""
        defaults = {id(generator) for generator in _defaults()}
        return tuple(g for key, (g, _) in self._start.items() if key not in defaults)

    def before_call(self) -> None:
        """Raise GeneratorChanged where a generator's state changed since the last torch
        call (or the trace's start)."""
        for key, (generator, _) in self._start.items():
            if _state(generator) != self._expected[key]:
                raise GeneratorChanged(
                    f"the state of the random generator {generator!r} changed outside torch's "
                    "functions (torch.manual_seed, Generator.manual_seed, set_rng_state in the "
                    "quantum function)"
                )

    def after_call(self) -> bool:
        """Whether the call just made drew from a watched generator."""
        drew = False
        for key, (generator, _) in self._start.items():
            state = _state(generator)
            if state != self._expected[key]:
                self._expected[key] = state
                drew = True
        return drew

    def rewind(self) -> None:
        """Every watched torch generator back to its state at the trace's start."""
        restore(self._start.values())

    def states_now(self) -> list[tuple[torch.Generator, bytes]]:
        """The watched torch generators' states now (for ``restore``)."""
        return [(generator, _state(generator)) for generator, _ in self._start.values()]

    def rewind_everything(self) -> None:
        """``rewind``, and numpy's and Python's global generators back to their states at
        the trace's start (a refused trace's quantum function runs again)."""
        self.rewind()
        np.random.set_state(self._numpy_start)
        random.setstate(self._python_start)
