"""JAX workers: the user's pure loss of a parameter pytree and a batch, on fastsgd's strategies.

    import fastsgd as fs
    from fastsgd.frameworks import jax as fj

    job = fs.Job(model=fj.Model(init=init, apply=apply, loss=loss), data="fashion_mnist")

`init(key) -> params` (or the params themselves, a pytree of arrays), `apply(params, x) ->
outputs` for evaluation, and `loss(params, (x, y)) -> scalar` (default: softmax
cross-entropy of apply's outputs against integer labels). Each worker keeps the parameters
as torch tensors, which the strategies read and write in place; at each step JAX sees them,
the batch and its own gradients without copies (DLPack), jit-compiled once per process.
The optimizer is the config's torch one, or an optax one: `optimizer=fj.optax_optimizer(tx)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch import nn

from fastsgd.errors import UserError
from fastsgd.frameworks.base import register, user_code_failed
from fastsgd.workloads.dataset import Dataset

Params = Any  # a pytree of arrays


def cross_entropy(apply: Callable) -> Callable:
    """The default loss: mean softmax cross-entropy of apply's outputs (integer labels)."""
    def loss(params: Params, batch: tuple) -> jax.Array:
        x, y = batch
        logits = apply(params, x)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))
    return loss


class Model:
    """A JAX model for Job(model=...): called in each worker (after torch.manual_seed(
    run.seed)), it builds that worker's JaxModule, with init's key drawn from the seed."""

    BRINGS_ITS_STEP = True  # its step is model.loss(x, y): the user's JAX loss

    def __init__(self, init: Callable[[jax.Array], Params] | Params, apply: Callable,
                 loss: Callable[[Params, tuple], jax.Array] | None = None) -> None:
        self.init, self.apply = init, apply
        self.loss = loss or cross_entropy(apply)
        self.value_and_grad = jax.jit(jax.value_and_grad(self.loss))
        self.forward = jax.jit(apply)

    def __call__(self) -> JaxModule:
        _threads_like_torch()
        params = self.init(jax.random.PRNGKey(torch.initial_seed())) if callable(
            self.init) else self.init
        return JaxModule(self, params)

    def fork_hazard(self) -> str | None:
        """Why workers forked now would hang: JAX's thread pools, once started in this
        process, are not fork-safe. None: JAX has not run here yet."""
        try:
            from jax._src import xla_bridge
        except ImportError:  # another JAX layout: its own warning at fork will say
            return None
        if not xla_bridge.backends_are_initialized():
            return None
        return ("this process ran JAX before starting its workers, and forked workers would "
                "deadlock in JAX's thread pools: give the parameters as init(key) (fastsgd "
                "calls it in each worker) and run no JAX computation before job.run(), or "
                "use torchrun or fastsgd simulate")

    def check_data(self, dataset: Dataset, batch_size: int) -> None:
        """Parameters that are a pytree of floating-point arrays, and a loss that is a scalar,
        checked on shapes alone (jax.eval_shape starts no JAX runtime in the launcher,
        whose forked workers could then not use it)."""
        try:
            params = jax.eval_shape(self.init, jax.ShapeDtypeStruct((2,), jnp.uint32)) \
                if callable(self.init) else self.init
            _check_leaves(params)
            x = jax.ShapeDtypeStruct((batch_size, *dataset.train_x.shape[1:]), jnp.float32)
            y = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
            out = jax.eval_shape(self.loss, params, (x, y))
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's JAX code failed on these shapes
            raise UserError(f"the JAX model fails on data '{dataset.name}': "
                            f"{user_code_failed(e)}") from None
        if not (isinstance(out, jax.ShapeDtypeStruct) and out.shape == ()
                and jnp.issubdtype(out.dtype, jnp.floating)):
            what = f"shape {tuple(out.shape)}" if hasattr(out, "shape") else type(out).__name__
            raise UserError(f"the JAX loss must return the batch's loss as a floating-point "
                            f"scalar; it returned {what}")


def _threads_like_torch() -> None:
    """A worker computes on one thread (launch.py, the simulator): so does XLA, if its
    runtime has not started in this process yet (it reads XLA_FLAGS then). Otherwise
    several worker processes' thread pools fight over the cores, unevenly."""
    if torch.get_num_threads() != 1 or "xla_cpu_multi_thread_eigen" in os.environ.get(
            "XLA_FLAGS", ""):
        return
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_cpu_multi_thread_eigen=false").strip()


def _check_leaves(params: Params) -> None:
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    if not leaves:
        raise UserError("the JAX model's parameters are empty: init must return a pytree of "
                        "arrays")
    for path, leaf in leaves:
        dtype = getattr(leaf, "dtype", None)
        if not hasattr(leaf, "shape") or dtype is None or not jnp.issubdtype(dtype,
                                                                             jnp.floating):
            what = f"an array of {dtype}" if dtype is not None else type(leaf).__name__
            raise UserError(f"the JAX model's parameter {_name(path)!r} is {what}: "
                            "parameters must be a pytree of floating-point arrays")


def _name(path: tuple) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
                    for k in path) or "params"


class JaxModule(nn.Module):
    """One worker's JAX model as a torch module: the parameters are torch tensors named by
    their pytree paths (layers.0.w), `loss(x, y)` is the user's loss with JAX's gradient
    as its backward, and calling it is `apply` (evaluation)."""

    def __init__(self, model: Model, params: Params) -> None:
        super().__init__()
        _check_leaves(params)
        leaves, self.__dict__["treedef"] = jax.tree_util.tree_flatten_with_path(params)
        self.__dict__["model"] = model
        # JAX's leaf order, which parameters() need not follow ({"a": {"w"}, "b"} lists b
        # first: a module's own parameters come before its submodules')
        self.__dict__["leaf_names"] = [_name(path) for path, _ in leaves]
        for name, (_, leaf) in zip(self.leaf_names, leaves):  # one copy, at the start
            register(self, name, torch.from_dlpack(jnp.asarray(leaf)).clone(), True)

    def __deepcopy__(self, memo: dict) -> JaxModule:
        copy = JaxModule.__new__(JaxModule)
        nn.Module.__init__(copy)
        copy.__dict__.update(model=self.model, treedef=self.treedef, training=self.training,
                             leaf_names=self.leaf_names)
        for name in self.leaf_names:
            register(copy, name, self.get_parameter(name).detach().clone(), True)
        return copy

    def leaves(self) -> list[nn.Parameter]:
        """The parameters in the pytree's leaf order."""
        return [self.get_parameter(name) for name in self.leaf_names]

    def _tree(self) -> Params:
        return jax.tree_util.tree_unflatten(self.treedef, [_to_jax(p) for p in self.leaves()])

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _JaxLoss.apply(self, x, y, *self.leaves())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_dlpack(self.model.forward(self._tree(), _to_jax(x)))


def _to_jax(t: torch.Tensor) -> jax.Array:
    """Without a copy where DLPack allows (a contiguous CPU or CUDA tensor)."""
    return jax.dlpack.from_dlpack(t.detach().contiguous())


class _JaxLoss(torch.autograd.Function):
    """The loss as a torch op: forward runs JAX's value_and_grad once; backward hands
    its gradients to autograd (scaled by the incoming gradient, 1 for loss.backward())."""

    @staticmethod
    def forward(ctx: Any, module: JaxModule, x: torch.Tensor, y: torch.Tensor,
                *params: torch.Tensor) -> torch.Tensor:
        labels = _to_jax(y.to(torch.int32))  # JAX computes in 32 bits unless x64 is on
        loss, grads = module.model.value_and_grad(module._tree(), (_to_jax(x), labels))
        ctx.grads = [torch.from_dlpack(g) for g in jax.tree_util.tree_leaves(grads)]
        return torch.from_dlpack(loss).clone()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple:
        grads, ctx.grads = ctx.grads, None
        if float(grad_output) != 1.0:
            grads = [g * grad_output for g in grads]
        return (None, None, None, *grads)


def optax_optimizer(transformation: Any) -> Callable[[Any], torch.optim.Optimizer]:
    """An optax GradientTransformation as Job's optimizer: `optimizer=optax_optimizer(
    optax.adam(1e-3))`. Each worker's optimizer keeps its own optax state."""
    def make(params: Any) -> torch.optim.Optimizer:
        return OptaxOptimizer(params, transformation)
    return make


class OptaxOptimizer(torch.optim.Optimizer):
    """optax behind torch's Optimizer interface: step() runs the transformation's update,
    jit-compiled, on the torch parameters and gradients seen through DLPack, and adds the
    updates in place. Its state checkpoints as plain tensors (state_dict)."""

    def __init__(self, params: Any, transformation: Any) -> None:
        super().__init__(params, {"transformation": transformation})
        self._tx, self._state = transformation, None
        self._update = jax.jit(transformation.update)

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Callable | None = None) -> None:
        params = self._params()
        tree = [_to_jax(p) for p in params]
        grads = [_to_jax(p.grad) if p.grad is not None else jnp.zeros(p.shape, jnp.float32)
                 for p in params]
        if self._state is None:
            self._state = self._tx.init(tree)
        updates, self._state = self._update(grads, self._state, tree)
        for p, u in zip(params, updates):
            p.add_(torch.from_dlpack(u))

    def state_dict(self) -> dict[str, Any]:
        leaves = jax.tree_util.tree_leaves(self._state) if self._state is not None else []
        return {"optax": [torch.from_dlpack(np.asarray(v)).clone() for v in leaves]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        leaves = state_dict.get("optax", [])
        if not leaves:
            self._state = None
            return
        like = self._tx.init([_to_jax(p) for p in self._params()])
        treedef = jax.tree_util.tree_structure(like)
        self._state = jax.tree_util.tree_unflatten(treedef, [_to_jax(t) for t in leaves])
