"""Optimizers as recurrences over the parameters' iteration dim.

``step()`` defines each parameter at ``i + 1`` from its value and gradient at ``i``
(over ``(i, u)``: at ``(i, u + 1)`` and, after an iteration's last update, ``(i + 1, 0)``);
optimizer state (momenta, step count) is a placeholder cycle over the same dim, with a
loadable initial value. The learning rate may be any RT (``3e-4 * 0.99 ** i``). The
update rules follow optax's (``optax.adam`` and friends), so trajectories match it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from tempo.api.context import Context
from tempo.api.tensor import RecurrentTensor, constant
from tempo.errors import TempoError, user_site
from tempo.symbolic.expr import Symbol

LearningRate = float | RecurrentTensor


class State:
    """One optimizer state tensor: a placeholder over the iteration dim."""

    def __init__(self, ctx: Context, name: str, shape: tuple[int, ...], dtype: str,
                 domain: tuple[Symbol, ...], fill: float = 0.0):
        self.name = name
        self.initial = constant(ctx, np.full(shape, fill, dtype=dtype))
        op = ctx.add_op("merge", [], {"out_type": self.initial.type}, domain=domain, phis=[],
                        label=name)
        self.value = RecurrentTensor(ctx, op)
        self.value[(0,) * len(domain)] = self.initial
        self.next: RecurrentTensor | None = None

    def define_next(self, value: RecurrentTensor) -> None:
        define_next_step(self.value, value)
        self.next = value


def define_next_step(x: RecurrentTensor, new: RecurrentTensor) -> None:
    """Define placeholder ``x`` at the step after each point as ``new`` there.

    Over ``(i,)``: ``x[i+1] = new``. Over ``(i, u)`` (several updates per iteration):
    ``x[i, u+1] = new`` and ``x[i+1, 0] = new[i, U-1]``."""
    if len(x.domain) == 1:
        x[x.domain[0] + 1] = new
        return
    outer, inner = x.domain
    x[outer, inner + 1] = new
    x[outer + 1, 0] = new[outer, x.ctx.bound_of[inner] - 1]


def after_last_update(x: RecurrentTensor) -> RecurrentTensor:
    """``x`` (an RT over a parameter's domain) at an iteration's last update, or ``x`` itself
    for parameters updated once per iteration: a value per iteration."""
    if len(x.domain) < 2:
        return x
    outer, inner = x.domain[:2]
    return x[outer, x.ctx.bound_of[inner] - 1]


class Optimizer:
    """Base class: parameters, learning rate, optional global gradient-norm clipping."""

    def __init__(self, params: Iterable[RecurrentTensor], lr: LearningRate,
                 max_grad_norm: float | None = None):
        self.params = list(params)
        if not self.params:
            raise TempoError("the optimizer got no parameters", user_site())
        self.ctx = self.params[0].ctx
        for p in self.params:
            _check_parameter(p)
        domains = {p.domain for p in self.params}
        if len(domains) > 1:
            raise TempoError(f"the parameters vary over different dims ({sorted(str(d) for d in domains)}); "
                             f"one optimizer steps parameters of one domain", user_site())
        self.lr = lr
        self.max_grad_norm = max_grad_norm
        self.states: dict[str, State] = {}
        self.next_values: dict[str, RecurrentTensor] = {}
        """Name → the value each parameter and state takes at the next iteration (an RT at
        the current one): what a checkpoint saves."""
        self._stepped = False
        self.grad_norm: RecurrentTensor | None = None
        """The gradients' joint L2 norm before clipping (set by ``step``), e.g. to log."""

    def state(self, name: str, like: RecurrentTensor, fill: float = 0.0) -> State:
        """A state tensor shaped like parameter ``like``."""
        shape = tuple(int(d.value) for d in like.shape)
        return self._add_state(State(self.ctx, name, shape, like.dtype, like.domain, fill))

    def _add_state(self, state: State) -> State:
        self.states[state.name] = state
        return state

    def step(self) -> None:
        """Define every parameter at the next iteration (call once, after backward())."""
        if self._stepped:
            raise TempoError("step() was already called: an optimizer defines the next "
                             "iteration once", user_site())
        self._stepped = True
        grads = [p.grad for p in self.params]
        self.grad_norm = global_norm(grads)
        if self.max_grad_norm is not None:
            grads = clip_by_global_norm(grads, self.max_grad_norm, self.grad_norm)
        count = self._add_state(State(self.ctx, "count", (), "float32", self.params[0].domain))
        count.define_next(count.value + 1.0)
        for k, (p, g) in enumerate(zip(self.params, grads)):
            new = p - self.lr * self.direction(k, p, g, count.value + 1.0)
            define_next_step(p, new)
            self.next_values[f"param{k}"] = after_last_update(new)
        for name, state in self.states.items():
            self.next_values[name] = after_last_update(state.next)

    def checkpoint_state(self) -> dict[str, RecurrentTensor]:
        """Everything a resumed run needs (parameters and state), as of the next iteration."""
        if not self._stepped:
            raise TempoError("call step() before asking for the checkpoint state", user_site())
        return dict(self.next_values)

    def direction(self, k: int, p: RecurrentTensor, g: RecurrentTensor,
                  count: RecurrentTensor) -> RecurrentTensor:
        """The update before the learning rate (``count`` is the 1-based step number)."""
        raise NotImplementedError

    def state_tensors(self) -> dict[str, RecurrentTensor]:
        """Name → state RT, for checkpoints."""
        return {name: s.value for name, s in self.states.items()}

    def load_state(self, values: dict[str, np.ndarray]) -> None:
        """Initial parameters and state from a checkpoint written with
        ``checkpoint_state()``, so that this run continues the saved one."""
        initial = {f"param{k}": _initial_constant(p) for k, p in enumerate(self.params)}
        initial.update({name: s.initial for name, s in self.states.items()})
        for name, const in initial.items():
            if name not in values:
                raise TempoError(f"checkpoint has no value for {name}")
            replace_constant(const, values[name], name)


class SGD(Optimizer):
    """Gradient descent, with (Nesterov) momentum as ``optax.sgd``."""

    def __init__(self, params: Iterable[RecurrentTensor], lr: LearningRate, momentum: float = 0.0,
                 nesterov: bool = False, max_grad_norm: float | None = None):
        super().__init__(params, lr, max_grad_norm)
        self.momentum, self.nesterov = momentum, nesterov

    def direction(self, k, p, g, count):
        if not self.momentum:
            return g
        trace = self.state(f"trace{k}", p)
        new = g + self.momentum * trace.value
        trace.define_next(new)
        return g + self.momentum * new if self.nesterov else new


class Adam(Optimizer):
    """Adam with bias correction, as ``optax.adam``."""

    def __init__(self, params: Iterable[RecurrentTensor], lr: LearningRate = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 eps_root: float = 0.0, max_grad_norm: float | None = None):
        super().__init__(params, lr, max_grad_norm)
        self.b1, self.b2 = betas
        self.eps, self.eps_root = eps, eps_root

    def direction(self, k, p, g, count):
        mu, nu = self.state(f"mu{k}", p), self.state(f"nu{k}", p)
        mu_next = (1.0 - self.b1) * g + self.b1 * mu.value
        nu_next = (1.0 - self.b2) * g * g + self.b2 * nu.value
        mu.define_next(mu_next)
        nu.define_next(nu_next)
        mu_hat = mu_next / (1.0 - _power(self.ctx, self.b1, count))
        nu_hat = nu_next / (1.0 - _power(self.ctx, self.b2, count))
        return mu_hat / ((nu_hat + self.eps_root).sqrt() + self.eps)


class AdamW(Adam):
    """Adam with decoupled weight decay, as ``optax.adamw``."""

    def __init__(self, params: Iterable[RecurrentTensor], lr: LearningRate = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-4, max_grad_norm: float | None = None):
        super().__init__(params, lr, betas, eps, max_grad_norm=max_grad_norm)
        self.weight_decay = weight_decay

    def direction(self, k, p, g, count):
        return super().direction(k, p, g, count) + self.weight_decay * p


class RMSprop(Optimizer):
    """``g / sqrt(nu + eps)`` with a running mean of squares, as ``optax.rmsprop``."""

    def __init__(self, params: Iterable[RecurrentTensor], lr: LearningRate = 1e-2,
                 decay: float = 0.9, eps: float = 1e-8, max_grad_norm: float | None = None):
        super().__init__(params, lr, max_grad_norm)
        self.decay, self.eps = decay, eps

    def direction(self, k, p, g, count):
        nu = self.state(f"nu{k}", p)
        nu_next = self.decay * nu.value + (1.0 - self.decay) * g * g
        nu.define_next(nu_next)
        return g / (nu_next + self.eps).sqrt()


def global_norm(grads: Sequence[RecurrentTensor]) -> RecurrentTensor:
    """The joint L2 norm of all gradients."""
    total = None
    for g in grads:
        sq = (g * g).sum()
        total = sq if total is None else total + sq
    return total.sqrt()


def clip_by_global_norm(grads: Sequence[RecurrentTensor], max_norm: float,
                        norm: RecurrentTensor | None = None) -> list[RecurrentTensor]:
    """Scale all gradients by ``max_norm / norm`` when their joint norm (``norm``, computed
    if not given) exceeds it."""
    from tempo.api.functions import where
    norm = global_norm(grads) if norm is None else norm
    return [where(norm < max_norm, g, g / norm * max_norm) for g in grads]


def _initial_constant(p: RecurrentTensor) -> RecurrentTensor:
    """The constant that defines a parameter at the first iteration."""
    for edge in p.ctx.graph.in_edges(p.op):
        if edge.src.kind == "const":
            return RecurrentTensor(p.ctx, edge.src)
    raise TempoError(f"{p!r} has no constant initial value to load into", user_site())


def replace_constant(const: RecurrentTensor, array: np.ndarray, name: str) -> None:
    """Give constant ``const`` (an initial value) the value ``array`` of the same shape."""
    current = const.op.params["value"]
    array = np.asarray(array)
    if array.shape != current.shape:
        raise TempoError(f"{name} has shape {current.shape}, the checkpoint's {array.shape}")
    if array.dtype.kind != current.dtype.kind:
        raise TempoError(f"{name} is {current.dtype}, the checkpoint's {array.dtype}")
    const.op.params["value"] = array.astype(current.dtype)


def _power(ctx: Context, base: float, exponent: RecurrentTensor) -> RecurrentTensor:
    return constant(ctx, np.asarray(base, np.float32)) ** exponent


def _check_parameter(p: RecurrentTensor) -> None:
    if not isinstance(p, RecurrentTensor) or not p.requires_grad:
        raise TempoError(f"{p!r} is not a parameter (a tensor that requires grad)", user_site())
    if p.op.kind != "merge" or len(p.domain) not in (1, 2):
        raise TempoError(f"{p!r} does not vary over an iteration dim: create modules with "
                         f"domain=(i,) (or (i, u) for several updates per iteration) so that "
                         f"the optimizer can define the next step", user_site())
