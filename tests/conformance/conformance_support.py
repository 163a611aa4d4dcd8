"""Shared pieces of the conformance suite (tests/conformance/): the differentiation
configurations a QNode can ask for, one adapter per ML interface (trainable arguments,
Jacobians, Hessians, the array type a QNode returns) and the comparison of a result with
default.qubit's.

The suite checks, category by category of PennyLane's QNode interface tests, that a QNode
on ``custatevec.qubit`` behaves as the same QNode on ``default.qubit``: the same values,
gradients, Jacobians and Hessians, the same shapes and the same array types. The reference
is default.qubit with ``diff_method="backprop"`` (exact derivatives of every order) unless a
test says otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import pennylane as qml
import pytest
import torch
from autograd.builtins import SequenceBox
from autograd.tracer import getval
from conftest import DEVICE, assert_allclose_nested
from pennylane import numpy as pnp

ATOL = 1e-8
"""Analytic results and derivatives: custatevec and default.qubit agree to round-off."""

GRAD_MODES = ("deferred", "eager")
INTERFACE_NAMES = ("autograd", "torch", "jax")


@dataclasses.dataclass(frozen=True)
class DiffConfig:
    """What a QNode asks for: a differentiation method and, for the device's own
    derivatives, where they are computed (``grad_on_execution``) and whether the device
    computes vector-Jacobian products (``device_vjp``) or whole Jacobians."""

    name: str
    diff_method: str
    grad_on_execution: bool | str = "best"
    device_vjp: bool = False

    @property
    def uses_device_derivatives(self) -> bool:
        """Whether custatevec's own adjoint method differentiates ("best" becomes adjoint
        for first derivatives of analytic circuits)."""
        return self.diff_method in ("adjoint", "best")

    def qnode_kwargs(self) -> dict:
        kwargs = {"diff_method": self.diff_method}
        if self.diff_method == "adjoint":
            kwargs["grad_on_execution"] = self.grad_on_execution
            kwargs["device_vjp"] = self.device_vjp
        return kwargs


ADJOINT_JACOBIAN_ON_EXECUTION = DiffConfig("adjoint-jac-goe", "adjoint", True, False)
ADJOINT_JACOBIAN = DiffConfig("adjoint-jac", "adjoint", False, False)
ADJOINT_VJP = DiffConfig("adjoint-vjp", "adjoint", False, True)
PARAMETER_SHIFT = DiffConfig("parameter-shift", "parameter-shift")
BEST = DiffConfig("best", "best")

ADJOINT_CONFIGS = (ADJOINT_JACOBIAN_ON_EXECUTION, ADJOINT_JACOBIAN, ADJOINT_VJP)
DIFF_CONFIGS = (*ADJOINT_CONFIGS, PARAMETER_SHIFT, BEST)


def config_mode_params(configs: Sequence[DiffConfig] = DIFF_CONFIGS) -> list:
    """pytest params (config, grad_accumulation): both accumulation modes for a config
    that differentiates on the device, one for parameter-shift (the device only executes,
    and the mode does not enter)."""
    params = []
    for config in configs:
        modes = GRAD_MODES if config.uses_device_derivatives else ("deferred",)
        params += [pytest.param(config, mode, id=f"{config.name}-{mode}") for mode in modes]
    return params


def interface_config_params(
    interfaces: Sequence[str] | None = None, configs: Sequence[DiffConfig] = DIFF_CONFIGS
) -> list:
    """pytest params (interface name, config, grad_accumulation) for every interface and
    ``config_mode_params(configs)``; jax without ``grad_on_execution=True`` (PennyLane
    resets it to False for jax: the same run as the config without it)."""
    params = []
    for name in interfaces or INTERFACE_NAMES:
        for param in config_mode_params(configs):
            config, mode = param.values
            if name == "jax" and config.grad_on_execution is True:
                continue
            params.append(pytest.param(name, config, mode, id=f"{name}-{param.id}"))
    return params


def custatevec_device(wires, grad_accumulation: str = "deferred", **kwargs):
    """custatevec.qubit on its CPU backend (unless ``backend`` is given)."""
    kwargs.setdefault("backend", "cpu")
    return qml.device(DEVICE, wires=wires, grad_accumulation=grad_accumulation, **kwargs)


def reference_device(wires, **kwargs):
    return qml.device("default.qubit", wires=wires, **kwargs)


def reference_qnode(circuit, wires, **kwargs):
    """default.qubit's backprop QNode of ``circuit``, in the interface of its arguments
    (so that its derivatives can be taken in ``Interface.for_reference_derivatives``)."""
    return qml.QNode(circuit, reference_device(wires), diff_method="backprop", **kwargs)


def three_qubit_gates(x, y):
    """The gates of the generic 3-qubit circuit the QNode and shot tests measure: a
    scalar ``x`` and a 2-vector ``y`` enter them, every wire is entangled."""
    qml.RX(x, wires=0)
    qml.RY(y[0], wires=1)
    qml.CNOT(wires=[0, 1])
    qml.RX(y[1], wires=2)
    qml.CNOT(wires=[1, 2])


# ---------------------------------------------------------------------------------------
# ML interfaces


def flat_real(result):
    """Every output of a QNode as one real 1-d array of the interface's type (complex
    outputs as real parts, then imaginary parts), so that one Jacobian call covers
    tuples, ragged shapes and states alike."""
    leaves = []

    def collect(part):
        if isinstance(part, (tuple, list, SequenceBox)):  # autograd boxes tuples it traces
            for p in part:
                collect(p)
            return
        flat = qml.math.reshape(part, (-1,))
        if "complex" in qml.math.get_dtype_name(flat):
            leaves.extend([qml.math.real(flat), qml.math.imag(flat)])
        else:
            leaves.append(flat)

    collect(result)
    return leaves[0] if len(leaves) == 1 else qml.math.concatenate(leaves)


class Interface:
    """How one ML framework makes trainable arguments and takes derivatives. Derivatives
    are returned as numpy arrays: one per argument, shaped (outputs, *argument shape)."""

    name: str
    array_types: tuple

    def trainable(self, value):
        raise NotImplementedError

    def constant(self, value):
        raise NotImplementedError

    def jacobian(self, fn: Callable, args: Sequence) -> tuple:
        raise NotImplementedError

    def hessian(self, fn: Callable, arg) -> np.ndarray:
        """d^2 (flattened outputs) / d arg^2, shaped (outputs, *arg.shape, *arg.shape)."""
        raise NotImplementedError

    def args(self, values: Sequence) -> tuple:
        return tuple(self.trainable(v) for v in values)

    def for_reference_derivatives(self) -> Interface:
        """The interface in which default.qubit's reference derivatives are taken."""
        return self


class AutogradInterface(Interface):
    name = "autograd"
    array_types = (np.ndarray,)

    def trainable(self, value):
        return pnp.array(value, dtype=np.float64, requires_grad=True)

    def constant(self, value):
        return pnp.array(value, requires_grad=False)

    def jacobian(self, fn, args):
        argnums = list(range(len(args)))
        jac = qml.jacobian(lambda *a: flat_real(fn(*a)), argnums=argnums)(*args)
        jac = jac if isinstance(jac, tuple) else (jac,)
        return tuple(np.asarray(j) for j in jac)

    def hessian(self, fn, arg):
        flat = lambda a: flat_real(fn(a))  # noqa: E731
        hessian = getval(qml.jacobian(qml.jacobian(flat))(arg))
        # where the QNode's output is indexed, PennyLane's second-order autograd boundary
        # leaves autograd boxes around the (right) values, on default.qubit too
        return np.vectorize(getval, otypes=[np.float64])(np.asarray(hessian))


class TorchInterface(Interface):
    name = "torch"
    array_types = (torch.Tensor,)

    def trainable(self, value):
        return torch.tensor(value, dtype=torch.float64, requires_grad=True)

    def constant(self, value):
        return torch.as_tensor(np.asarray(value))  # numpy's dtype: float64, complex128

    def jacobian(self, fn, args):
        jac = torch.autograd.functional.jacobian(lambda *a: flat_real(fn(*a)), tuple(args))
        return tuple(j.detach().numpy() for j in jac)

    def hessian(self, fn, arg):
        def first(a):
            return torch.autograd.functional.jacobian(
                lambda b: flat_real(fn(b)), a, create_graph=True
            )

        return torch.autograd.functional.jacobian(first, arg).detach().numpy()


class JaxInterface(Interface):
    name = "jax"

    def __init__(self):
        self.jax = pytest.importorskip("jax")
        self.jax.config.update("jax_enable_x64", True)
        self.array_types = (self.jax.Array,)

    def trainable(self, value):
        return self.jax.numpy.array(value, dtype=np.float64)

    def constant(self, value):
        return self.jax.numpy.array(np.asarray(value))

    def jacobian(self, fn, args, forward: bool = False):
        take = self.jax.jacfwd if forward else self.jax.jacrev
        jac = take(lambda *a: flat_real(fn(*a)), argnums=tuple(range(len(args))))(*args)
        return tuple(np.asarray(j) for j in jac)

    def hessian(self, fn, arg):
        flat = lambda a: flat_real(fn(a))  # noqa: E731
        return np.asarray(self.jax.hessian(flat)(arg))  # forward over reverse mode

    def for_reference_derivatives(self) -> Interface:
        """autograd: default.qubit's backprop derivatives in jax (without jit) take
        seconds per circuit, and they are the same numbers."""
        return AutogradInterface()


def interface(name: str) -> Interface:
    """The adapter of ``name`` (the jax one skips the test where jax is not installed)."""
    return {"autograd": AutogradInterface, "torch": TorchInterface, "jax": JaxInterface}[name]()


# ---------------------------------------------------------------------------------------
# comparisons


def to_numpy(result):
    """A QNode's result, nested as it came, with numpy leaves (dicts: counts, unchanged)."""
    if isinstance(result, dict):
        return result
    if isinstance(result, (tuple, list)):
        return type(result)(to_numpy(r) for r in result)
    if isinstance(result, torch.Tensor):
        return result.detach().numpy()
    return np.asarray(result)


def assert_same_types(result, expected, array_types: tuple, path: str = "result"):
    """Same nesting; every leaf an array of the interface (``array_types``) with the dtype
    of default.qubit's leaf."""
    if isinstance(expected, (tuple, list)):
        assert type(result) is type(expected), f"{path}: {type(result)} != {type(expected)}"
        assert len(result) == len(expected), f"{path}: {len(result)} != {len(expected)}"
        for i, (r, e) in enumerate(zip(result, expected, strict=True)):
            assert_same_types(r, e, array_types, f"{path}[{i}]")
        return
    assert isinstance(result, array_types), f"{path}: {type(result)} is not {array_types}"
    assert qml.math.get_dtype_name(result) == qml.math.get_dtype_name(expected), (
        f"{path}: dtype {qml.math.get_dtype_name(result)} != {qml.math.get_dtype_name(expected)}"
    )


def assert_same_result(result, expected, atol: float = ATOL):
    """Same nesting, shapes and values (within ``atol``) as default.qubit's result."""
    assert_allclose_nested(to_numpy(result), to_numpy(expected), atol=atol)


def assert_same_derivatives(derivatives, expected, atol: float = ATOL):
    assert len(derivatives) == len(expected)
    for i, (d, e) in enumerate(zip(derivatives, expected, strict=True)):
        assert np.shape(d) == np.shape(e), f"derivative {i}: {np.shape(d)} != {np.shape(e)}"
        np.testing.assert_allclose(d, e, atol=atol, rtol=0, err_msg=f"derivative {i}")


def assert_same_torch_jacobian(ours: Callable, ref: Callable, x, atol: float = ATOL):
    """torch's Jacobian of ``ours`` at ``x`` is that of ``ref`` (default.qubit's function)."""
    np.testing.assert_allclose(
        torch.autograd.functional.jacobian(ours, x).numpy(),
        torch.autograd.functional.jacobian(ref, x).numpy(),
        atol=atol,
        rtol=0,
    )


_REFERENCE_JACOBIANS: dict = {}
"""default.qubit's Jacobians by ``reference_key`` (with the interface, values and
trainability they were taken for): one parametrized test's cases share them."""


def _values_key(values: Sequence) -> tuple:
    return tuple((np.asarray(v).dtype.str, np.shape(v), np.asarray(v).tobytes()) for v in values)


def assert_qnode_conforms(
    ours, ref, iface: Interface, values: Sequence, trainable=None, atol=ATOL, reference_key=None
):
    """``ours(*args)`` and ``ref(*args)`` (QNodes, or functions of QNodes) give the same
    result (types, dtypes, shapes, values) and the same Jacobian by each trainable
    argument. ``trainable``: which of ``values`` are trainable (default: all); the others
    are passed as constants of the interface. ``ref`` must accept the arguments of
    ``iface.for_reference_derivatives()`` too (see ``reference_qnode``).
    ``reference_key``: names ``ref``'s function, so that its Jacobian is taken once for
    all the cases of a parametrized test that share it (None: not kept)."""
    trainable = list(trainable) if trainable is not None else [True] * len(values)

    def all_args(trainable_args, of_iface):
        it = iter(trainable_args)
        return [
            next(it) if t else of_iface.constant(v) for v, t in zip(values, trainable, strict=True)
        ]

    def of_trainable(fn, of_iface):
        return lambda *trainable_args: fn(*all_args(trainable_args, of_iface))

    trainable_values = [v for v, t in zip(values, trainable, strict=True) if t]
    result = ours(*all_args(iface.args(trainable_values), iface))
    expected = ref(*all_args(iface.args(trainable_values), iface))
    assert_same_types(result, expected, iface.array_types)
    assert_same_result(result, expected, atol=atol)
    jacobian = iface.jacobian(of_trainable(ours, iface), iface.args(trainable_values))
    ref_iface = iface.for_reference_derivatives()
    key = (reference_key, ref_iface.name, tuple(trainable), _values_key(values))
    if reference_key is None or key not in _REFERENCE_JACOBIANS:
        _REFERENCE_JACOBIANS[key] = ref_iface.jacobian(
            of_trainable(ref, ref_iface), ref_iface.args(trainable_values)
        )
    assert_same_derivatives(jacobian, _REFERENCE_JACOBIANS[key], atol=atol)
