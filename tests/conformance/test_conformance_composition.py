"""QNodes composed with other code on custatevec.qubit against default.qubit: chained
QNodes (one QNode's outputs, classically processed, feed another, on one device or two);
PennyLane's templates (StronglyEntanglingLayers, BasicEntanglerLayers, AngleEmbedding,
also with a broadcast minibatch of features, trainable or not, and with a tuple of
trainable scalars as features) and user subclasses of templates; every interface and
differentiation configuration, both gradient accumulation modes.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from conformance_support import (
    ADJOINT_JACOBIAN,
    ADJOINT_VJP,
    BEST,
    PARAMETER_SHIFT,
    assert_qnode_conforms,
    custatevec_device,
    interface,
    interface_config_params,
    reference_qnode,
)
from conftest import stable_seed

RNG = np.random.default_rng(stable_seed("conformance-composition"))
FEATURES = RNG.uniform(-np.pi, np.pi, size=3)
FEATURE_BATCH = RNG.uniform(-np.pi, np.pi, size=(3, 3))
SEL_WEIGHTS = RNG.uniform(-np.pi, np.pi, size=(1, 3, 3))
BEL_WEIGHTS = RNG.uniform(-np.pi, np.pi, size=(2, 3))
WIRES = [0, 1, 2]


def qnode_pair(circuit, iface, config, mode, wires=WIRES):
    ours = qml.QNode(
        circuit, custatevec_device(wires, mode), interface=iface.name, **config.qnode_kwargs()
    )
    return ours, reference_qnode(circuit, wires)


# ---------------------------------------------------------------------------------------
# chained QNodes


def first_circuit(x):
    qml.RX(x[0], wires=0)
    qml.RY(x[1], wires=1)
    qml.CNOT(wires=[0, 1])
    return qml.expval(qml.Z(0)), qml.expval(qml.X(1) @ qml.Y(0))


def second_circuit(angles, w):
    qml.RY(angles[0], wires=0)
    qml.RX(angles[1], wires=1)
    qml.CNOT(wires=[1, 0])
    qml.RZ(w[0], wires=0)
    qml.RX(w[1], wires=0)
    return qml.probs(wires=[0]), qml.expval(qml.Z(0) @ qml.Z(1))


def chained(first, second):
    """The first QNode's outputs, scaled and squashed, are the second's angles."""

    def cost(x, w):
        a = qml.math.stack(first(x))
        angles = qml.math.tanh(a) * w[:2] + w[2]
        probs, zz = second(angles, w[3:])
        return qml.math.concatenate([probs * zz, qml.math.reshape(zz**2, (1,))])

    return cost


@pytest.mark.parametrize("one_device", [True, False], ids=["one_device", "two_devices"])
@pytest.mark.parametrize(("interface_name", "config", "mode"), interface_config_params())
def test_chained_qnodes(interface_name, config, mode, one_device):
    """Two QNodes in sequence: both forward passes run before either backward pass."""
    iface = interface(interface_name)
    ours_dev = custatevec_device(2, mode)
    second_dev = ours_dev if one_device else custatevec_device(2, mode)
    kwargs = {"interface": interface_name, **config.qnode_kwargs()}
    ours = chained(
        qml.QNode(first_circuit, ours_dev, **kwargs),
        qml.QNode(second_circuit, second_dev, **kwargs),
    )
    ref = chained(reference_qnode(first_circuit, 2), reference_qnode(second_circuit, 2))
    values = [np.array([0.4, -1.1]), np.array([0.8, -1.6, 0.3, 0.7, -0.2])]
    assert_qnode_conforms(ours, ref, iface, values, reference_key="chained")


# ---------------------------------------------------------------------------------------
# templates


def templates_circuit(features, sel_weights, bel_weights):
    qml.AngleEmbedding(features, wires=WIRES, rotation="Y")
    qml.StronglyEntanglingLayers(sel_weights, wires=WIRES)
    qml.BasicEntanglerLayers(bel_weights, wires=WIRES[::-1], rotation=qml.RZ)
    qml.StronglyEntanglingLayers(sel_weights, wires=WIRES[::-1], imprimitive=qml.CZ)
    return qml.expval(qml.Z(0) @ qml.X(2)), qml.probs(wires=[1])


@pytest.mark.parametrize(("interface_name", "config", "mode"), interface_config_params())
def test_templates(interface_name, config, mode):
    """Every template's arguments trainable."""
    iface = interface(interface_name)
    ours, ref = qnode_pair(templates_circuit, iface, config, mode)
    assert_qnode_conforms(
        ours, ref, iface, [FEATURES, SEL_WEIGHTS, BEL_WEIGHTS], reference_key="templates"
    )


BATCH_CONFIGS = [ADJOINT_JACOBIAN, ADJOINT_VJP, PARAMETER_SHIFT, BEST]


MINIBATCH_CASES = [
    pytest.param(*param.values, features_trainable, id=f"{param.id}-{label}")
    for features_trainable, label in ((False, "data"), (True, "trainable"))
    for param in interface_config_params(configs=BATCH_CONFIGS)
    # PennyLane's parameter-shift rule refuses trainable broadcast parameters: see below
    if not (features_trainable and param.values[1] is PARAMETER_SHIFT)
]


@pytest.mark.parametrize(
    ("interface_name", "config", "mode", "features_trainable"), MINIBATCH_CASES
)
def test_templates_feature_minibatch(interface_name, config, mode, features_trainable):
    """AngleEmbedding of a broadcast minibatch of features (a batch of 3): one result
    per entry, derivatives by the weights (and the features) of default.qubit's shape."""
    iface = interface(interface_name)
    ours, ref = qnode_pair(templates_circuit, iface, config, mode)
    assert_qnode_conforms(
        ours,
        ref,
        iface,
        [FEATURE_BATCH, SEL_WEIGHTS, BEL_WEIGHTS],
        trainable=[features_trainable, True, True],
        reference_key="minibatch",
    )


def test_trainable_feature_minibatch_refused_by_parameter_shift():
    """Parameter-shift with a trainable broadcast minibatch: PennyLane's error, as on
    default.qubit."""
    iface = interface("torch")
    for dev in (custatevec_device(3), qml.device("default.qubit", wires=3)):
        qnode = qml.QNode(templates_circuit, dev, diff_method="parameter-shift")
        with pytest.raises(NotImplementedError, match="broadcasted parameters"):
            iface.jacobian(qnode, iface.args([FEATURE_BATCH, SEL_WEIGHTS, BEL_WEIGHTS]))


class StronglyEntanglingSubclass(qml.StronglyEntanglingLayers):
    """A user subclass of a template (template_subclass.py) that decomposes into its
    parent."""

    def decomposition(self):
        return [qml.StronglyEntanglingLayers(*self.parameters, wires=self.wires)]


class PlainBasicEntanglerSubclass(qml.BasicEntanglerLayers):
    """A user subclass that changes nothing."""


class RenamedAngleEmbedding(qml.AngleEmbedding):
    """A user subclass with its own decomposition: RX(2 x) for each feature."""

    @staticmethod
    def compute_decomposition(features, wires, rotation):
        return [qml.RX(2 * features[..., i], wires=w) for i, w in enumerate(wires)]


def subclasses_circuit(features, sel_weights, bel_weights):
    RenamedAngleEmbedding(features, wires=WIRES)
    StronglyEntanglingSubclass(sel_weights, wires=WIRES)
    PlainBasicEntanglerSubclass(bel_weights, wires=WIRES)
    return qml.expval(qml.Z(0) @ qml.Z(1)), qml.probs(wires=[2])


@pytest.mark.parametrize(
    ("interface_name", "config", "mode"), interface_config_params(configs=BATCH_CONFIGS)
)
def test_template_subclasses(interface_name, config, mode):
    """Subclasses of the templates run as default.qubit runs them (by their own
    decompositions), forward and differentiated."""
    iface = interface(interface_name)
    ours, ref = qnode_pair(subclasses_circuit, iface, config, mode)
    assert_qnode_conforms(
        ours, ref, iface, [FEATURES, SEL_WEIGHTS, BEL_WEIGHTS], reference_key="subclasses"
    )


@pytest.mark.parametrize(
    ("interface_name", "config", "mode"),
    interface_config_params(["autograd"], configs=BATCH_CONFIGS),
)
def test_angle_embedding_of_trainable_scalars(interface_name, config, mode):
    """angle_tuple.py: AngleEmbedding of a tuple of trainable autograd scalars. One
    output: with two (a tuple of expectation values), PennyLane's parameter-shift
    Jacobian of a QNode with ``interface="autograd"`` is zero on default.qubit as here
    (its autograd boundary loses the tuple's dependence; measured: default.qubit
    ``(0, 0), (0, 0)`` where backprop gives ``(0, 0), (-0.644, 0)``). Torch and jax: see
    ``test_angle_embedding_of_trainable_scalars_refused``."""
    iface = interface(interface_name)
    ours, ref = qnode_pair(angle_tuple_circuit, iface, config, mode, wires=2)
    assert_qnode_conforms(ours, ref, iface, [0.3, 0.7], reference_key="angle_tuple")


def angle_tuple_circuit(a, b):
    qml.AngleEmbedding((a, b), wires=[0, 1])
    qml.CNOT(wires=[0, 1])
    return qml.expval(qml.Z(0) @ qml.X(1))


@pytest.mark.parametrize("interface_name", ["torch", "jax"])
def test_angle_embedding_of_trainable_scalars_refused(interface_name):
    """A tuple of trainable torch or jax scalars as AngleEmbedding's features: PennyLane's
    template converts the tuple through NumPy and raises while the QNode records for a
    derivative (torch: any trainable tensor; jax: a traced value), on default.qubit as
    here (the device is never reached): the same error on both."""
    iface = interface(interface_name)
    errors = []
    for qnode in qnode_pair(angle_tuple_circuit, iface, PARAMETER_SHIFT, "deferred", wires=2):
        with pytest.raises(Exception) as raised:  # noqa: PT011 (PennyLane's, as it is)
            iface.jacobian(qnode, iface.args([0.3, 0.7]))
        errors.append((type(raised.value), str(raised.value)))
    assert errors[0] == errors[1]
