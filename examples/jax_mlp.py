"""The MLP of fastsgd's built-in `mlp`, written in JAX, trained by fastsgd's strategies.

    python examples/jax_mlp.py                       # 4 worker processes, allreduce
    python examples/jax_mlp.py sgp --simulate        # 4 simulated workers, sgp
    python examples/jax_mlp.py dpsgd --optax         # with an optax optimizer

The step is a pure function of the parameters (a pytree) and a batch; fastsgd keeps the
parameters as torch tensors and hands them to JAX without copies (DLPack) at each step.
Run no JAX computation before job.run(): the workers are forked, and JAX's thread pools
are not fork-safe (fastsgd refuses in one line); init(key) runs in each worker.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import fastsgd as fs
from fastsgd.frameworks import jax as fj

SIZES = (784, 256, 256, 10)  # Fashion-MNIST's 28x28 inputs to 10 classes


def init(key: jax.Array) -> list[dict[str, jax.Array]]:
    """Uniform in +-1/sqrt(fan_in), as torch.nn.Linear initializes."""
    layers = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        key, kw, kb = jax.random.split(key, 3)
        bound = fan_in ** -0.5
        layers.append({"w": jax.random.uniform(kw, (fan_in, fan_out), minval=-bound,
                                               maxval=bound),
                       "b": jax.random.uniform(kb, (fan_out,), minval=-bound, maxval=bound)})
    return layers


def apply(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    """Logits of a batch of images (N, C, H, W)."""
    h = x.reshape(x.shape[0], -1)
    for layer in params[:-1]:
        h = jax.nn.relu(h @ layer["w"] + layer["b"])
    return h @ params[-1]["w"] + params[-1]["b"]


def loss(params: list[dict[str, jax.Array]], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Mean cross-entropy of the batch."""
    x, y = batch
    log_probs = jax.nn.log_softmax(apply(params, x))
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("strategy", nargs="?", default="allreduce")
    parser.add_argument("--simulate", action="store_true")
    parser.add_argument("--optax", action="store_true", help="optax SGD with momentum")
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    optimizer = None
    if args.optax:
        import optax

        optimizer = fj.optax_optimizer(optax.sgd(0.05, momentum=0.9))
    job = fs.Job(model=fj.Model(init, apply, loss), optimizer=optimizer,
                 data="fashion_mnist", strategy=args.strategy,
                 options={"run.workers": 4, "run.steps": args.steps, "run.eval_every": 500})
    result = job.simulate() if args.simulate else job.run()
    print(f"test accuracy {result.accuracy:.2%}; run directory {result.run_dir}")


if __name__ == "__main__":
    main()
