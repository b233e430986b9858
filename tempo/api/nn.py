"""Neural-network modules whose parameters are recurrent tensors.

A parameter with a domain (``domain=(i,)``) is a placeholder cycle over that dim: its
initial value at ``i = 0`` is a constant, and an optimizer's ``step()`` defines it at
``i + 1``. With ``domain=(i, u)`` it is updated several times per iteration (PPO's epochs
of minibatches): at ``(i, u + 1)``, and at ``(i + 1, 0)`` from the iteration's last
update. Without a domain it is a constant leaf. Either way it ``requires_grad``. Initial
values are drawn with NumPy from the context seed, so programs are reproducible.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from tempo.api.context import Context, active_context
from tempo.api.tensor import RecurrentTensor, constant
from tempo.errors import ShapeError, TempoError, user_site
from tempo.symbolic.expr import Symbol

# ---- initializers ---------------------------------------------------------------------------
Initializer = Callable[[tuple[int, ...], np.random.Generator], np.ndarray]


def orthogonal(gain: float = 1.0) -> Initializer:
    """An (semi-)orthogonal matrix times ``gain`` (as in ``torch.nn.init.orthogonal_``)."""
    def init(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        rows, cols = shape[0], int(np.prod(shape[1:]))
        flat = rng.standard_normal((max(rows, cols), min(rows, cols)))
        q, r = np.linalg.qr(flat)
        q = q * np.sign(np.diag(r))
        q = q if rows >= cols else q.T
        return (gain * q[:rows, :cols]).reshape(shape)
    return init


def xavier_uniform(gain: float = 1.0) -> Initializer:
    """Uniform in ``±gain * sqrt(6 / (fan_in + fan_out))``."""
    def init(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        fan_in, fan_out = shape[0], shape[-1]
        bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-bound, bound, shape)
    return init


def uniform(low: float = -0.05, high: float = 0.05) -> Initializer:
    return lambda shape, rng: rng.uniform(low, high, shape)


def normal(std: float = 0.02) -> Initializer:
    return lambda shape, rng: rng.standard_normal(shape) * std


def constant_init(value: float = 0.0) -> Initializer:
    return lambda shape, rng: np.full(shape, value)


zeros = constant_init(0.0)
ones = constant_init(1.0)


# ---- parameters ---------------------------------------------------------------------------
class Parameter:
    """A trainable tensor: its RT, the constant holding its initial value, its dim."""

    def __init__(self, ctx: Context, init: np.ndarray, domain: Sequence[Symbol], name: str):
        self.name = name
        self.initial = constant(ctx, np.asarray(init, np.float32))
        dims = ctx.ordered(domain)
        if len(dims) > 2:
            raise TempoError(f"parameter {name} varies over {len(dims)} dims; parameters vary "
                             f"over an iteration dim and, within it, an update dim at most",
                             user_site())
        self.dims: tuple[Symbol, ...] = dims
        if not dims:
            self.value = self.initial
        else:
            hint = (f"a parameter is defined at {dims[0].name} = 0 by its initial value and at "
                    f"{dims[0].name}+1 by an optimizer step (optim.Adam(params, ...).step(), after "
                    "loss.backward()): is the step missing, or does a read go past the last one?")
            value = ctx.add_op("merge", [], {"out_type": self.initial.type, "undefined": hint},
                               domain=dims, phis=[], label=name)
            self.value = RecurrentTensor(ctx, value)
            self.value[(0,) * len(dims)] = self.initial
        ctx.leaves.add(self.value.op.id)

    def load(self, array: np.ndarray) -> None:
        """Replace the initial value (e.g. from a checkpoint) before compiling."""
        array = np.asarray(array, np.float32)
        current = self.initial.op.params["value"]
        if array.shape != current.shape:
            raise ShapeError(f"parameter {self.name} has shape {current.shape}, the loaded "
                             f"value {array.shape}")
        self.initial.op.params["value"] = array


class Module:
    """A composition of parameters and submodules, called on RTs."""

    def __init__(self, domain: Sequence[Symbol] = ()):
        self.ctx = active_context()
        self.domain = tuple(domain)
        self._params: dict[str, Parameter] = {}
        self._modules: dict[str, Module] = {}

    def param(self, name: str, shape: tuple[int, ...], init: Initializer) -> RecurrentTensor:
        rng = np.random.default_rng([self.ctx.seed, len(self.ctx.graph.ops)])
        p = Parameter(self.ctx, init(shape, rng), self.domain, name)
        self._params[name] = p
        return p.value

    def add(self, name: str, module: Module) -> Module:
        self._modules[name] = module
        return module

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        for name, p in self._params.items():
            yield prefix + name, p
        for name, m in self._modules.items():
            yield from m.named_parameters(f"{prefix}{name}.")

    def parameters(self) -> list[RecurrentTensor]:
        """The parameters' RTs (what optimizers update)."""
        return [p.value for _, p in self.named_parameters()]

    def state(self) -> dict[str, RecurrentTensor]:
        """Name → parameter RT, for checkpoints."""
        return {name: p.value for name, p in self.named_parameters()}

    def load_state(self, values: dict[str, np.ndarray]) -> None:
        """Initial values from a checkpoint (every parameter must be present)."""
        for name, p in self.named_parameters():
            if name not in values:
                raise TempoError(f"checkpoint has no value for parameter {name}")
            p.load(values[name])

    def at(self, *index: Any) -> Module:
        """This module with every parameter read at ``index`` instead of at the basis point
        (``policy.at(i, 0)``: the parameters before an iteration's first update, for acting
        while the learner updates them over ``(i, u)``). Shares the parameters; defines none."""
        view = copy.copy(self)
        swap: dict[int, Any] = {id(m): m.at(*index) for m in self._modules.values()}
        swap.update({id(p.value): p.value[index] for p in self._params.values() if p.dims})
        view._modules = {name: swap[id(m)] for name, m in self._modules.items()}
        for name, attr in vars(self).items():
            if name in ("_params", "_modules"):
                continue
            if id(attr) in swap:
                setattr(view, name, swap[id(attr)])
            elif isinstance(attr, (list, tuple)) and any(id(a) in swap for a in attr):
                setattr(view, name, type(attr)(swap.get(id(a), a) for a in attr))
        return view

    def __call__(self, x: RecurrentTensor) -> RecurrentTensor:
        return self.forward(x)

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        raise NotImplementedError


# ---- activations ---------------------------------------------------------------------------
def relu(x: RecurrentTensor) -> RecurrentTensor:
    return x.relu()


def tanh(x: RecurrentTensor) -> RecurrentTensor:
    return x.tanh()


def gelu(x: RecurrentTensor) -> RecurrentTensor:
    """The tanh approximation (``jax.nn.gelu``'s default)."""
    return 0.5 * x * (1.0 + (math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)).tanh())


def silu(x: RecurrentTensor) -> RecurrentTensor:
    return x * x.sigmoid()


ACTIVATIONS: dict[str, Callable[[RecurrentTensor], RecurrentTensor]] = {
    "relu": relu, "tanh": tanh, "gelu": gelu, "silu": silu,
}


def get_activation(name: str) -> Callable[[RecurrentTensor], RecurrentTensor]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise TempoError(f"unknown activation {name!r}; choose one of {', '.join(ACTIVATIONS)}",
                         user_site()) from None


# ---- layers ------------------------------------------------------------------------------
class Linear(Module):
    """``x @ w + b`` with ``w`` of shape ``(in_features, out_features)``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 init: Initializer | None = None, bias_init: Initializer = zeros,
                 domain: Sequence[Symbol] = ()):
        super().__init__(domain)
        self.weight = self.param("weight", (in_features, out_features), init or orthogonal(math.sqrt(2)))
        self.bias = self.param("bias", (out_features,), bias_init) if bias else None

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        out = x @ self.weight
        return out + self.bias if self.bias is not None else out


class MLP(Module):
    """Linear layers with an activation between them (none after the last).

    ``in_features`` may be a shape (``(3, 4, 4)``): inputs' trailing dims of that shape
    are flattened first."""

    def __init__(self, in_features: int | Sequence[int], hidden: Sequence[int], out_features: int,
                 activation: str = "tanh", hidden_gain: float = math.sqrt(2),
                 out_gain: float = 1.0, domain: Sequence[Symbol] = ()):
        super().__init__(domain)
        self.in_shape = (in_features,) if isinstance(in_features, int) else tuple(in_features)
        sizes = [math.prod(self.in_shape), *hidden, out_features]
        self.act = get_activation(activation)
        self.layers = [
            self.add(f"layer{k}", Linear(a, b, init=orthogonal(out_gain if k == len(sizes) - 2
                                                              else hidden_gain), domain=domain))
            for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))]

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        if len(self.in_shape) > 1:
            x = x.reshape(*x.shape[:x.ndim - len(self.in_shape)], math.prod(self.in_shape))
        for k, layer in enumerate(self.layers):
            x = layer(x)
            if k < len(self.layers) - 1:
                x = self.act(x)
        return x


class LayerNorm(Module):
    """Normalize the last dim to zero mean and unit variance, then scale and shift."""

    def __init__(self, features: int, eps: float = 1e-5, domain: Sequence[Symbol] = ()):
        super().__init__(domain)
        self.eps = eps
        self.scale = self.param("scale", (features,), ones)
        self.shift = self.param("shift", (features,), zeros)

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        centered = x - x.mean(-1, keepdim=True)
        var = (centered * centered).mean(-1, keepdim=True)
        return centered / (var + self.eps).sqrt() * self.scale + self.shift


class RMSNorm(Module):
    """Scale the last dim by the reciprocal of its root mean square."""

    def __init__(self, features: int, eps: float = 1e-6, domain: Sequence[Symbol] = ()):
        super().__init__(domain)
        self.eps = eps
        self.scale = self.param("scale", (features,), ones)

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        return x / ((x * x).mean(-1, keepdim=True) + self.eps).sqrt() * self.scale


class Embedding(Module):
    """Rows of a ``(num_embeddings, features)`` table, picked by integer indices."""

    def __init__(self, num_embeddings: int, features: int, init: Initializer | None = None,
                 domain: Sequence[Symbol] = ()):
        super().__init__(domain)
        self.weight = self.param("weight", (num_embeddings, features), init or normal(1.0))

    def forward(self, idx: Any) -> RecurrentTensor:
        return self.weight[idx]
