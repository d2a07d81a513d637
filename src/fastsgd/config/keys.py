"""Every key of the TOML configuration but the strategy's and codec's: its type, default,
check and one-line doc, section by section (fastsgd keys prints them)."""

from __future__ import annotations

from fastsgd.config.objects import is_import_path
from fastsgd.config.options import Option, at_least, between, one_of, positive
from fastsgd.config.units import MAX_FACTOR, bandwidth_check, time_check

WEEK = 7 * 24 * 3600  # run.timeout's bound: socket timeouts overflow beyond ~9e9 s
SEEDS = between(0, 2 ** 63 - 1)  # torch.manual_seed takes 64 bits; data.py adds the epoch


def _slowdowns(values: list) -> str | None:
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and 1 <= v <= MAX_FACTOR
             for v in values)
    return None if ok else (f"must be a list of numbers from 1 to {MAX_FACTOR:g} (one factor "
                            "per worker rank)")


def _timeout(v: float) -> str | None:
    return None if 0 < v <= WEEK else f"must be > 0 and at most a week ({WEEK} s)"


def _below_one(v: float) -> str | None:
    return None if 0 <= v < 1 else "must be in [0, 1)"


def _bandwidths(values: dict) -> str | None:
    ok = all(str(k).isdigit() and not bandwidth_check(v) and isinstance(v, str)
             for k, v in values.items())
    return None if ok else 'must map worker ranks to bandwidths, e.g. {3 = "10Mbit"}'


def _crashes(values: list) -> str | None:
    ok = all(isinstance(v, dict) for v in values)
    return None if ok else "must be a list of tables, e.g. [{worker = 3, ...}]"


def _mtu(v: int) -> str | None:
    return None if v == 0 or v >= 576 else "must be 0 (payload only) or a frame size >= 576"


def _time(doc: str, default: str = "") -> Option:
    return Option(str, default, time_check, doc)


def _betas(v: list) -> str | None:
    ok = len(v) == 2 and all(isinstance(b, (int, float)) and not isinstance(b, bool)
                             and 0 <= b < 1 for b in v)
    return None if ok else "must be two numbers in [0, 1), e.g. [0.9, 0.95]"


def _seed_or_run(v: int) -> str | None:
    return None if v == -1 or SEEDS(v) is None else "must be -1 (run.seed) or 0 to 2**63 - 1"


def _profiled(values: dict) -> str | None:
    ok = all(isinstance(v, (str, int, float, bool, list)) for v in values.values())
    return None if ok else "must be a table of what profile measured for (profile writes it)"


def _optimizer_name(name: str) -> str | None:
    return None if name in OPTIMIZERS or is_import_path(name) else \
        "must be sgd, adam, adamw or an import path module:Class"


OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "linear", "cosine", "step")
PRECISIONS = ("fp32", "bf16", "fp16")
# the [optimizer] keys that fastsgd applies around any optimizer, its own or an imported
# class's (whose other keys are its keyword arguments): the schedule and clipping
KIT_KEYS = ("schedule", "warmup", "min_lr", "decay_every", "decay_factor", "clip_norm")


# The defaults are the demo: LeNet on Fashion-MNIST, 4 workers, synchronous all-reduce,
# global batch 128, which reaches 89-90% test accuracy in 8 epochs (README).
SCHEMA: dict[str, dict[str, Option]] = {
    "run": {
        "workers": Option(int, 4, at_least(1), "number of workers"),
        "steps": Option(int, 0, at_least(0), "training steps; 0 = use epochs"),
        "epochs": Option(float, 0.0, at_least(0), "epochs over the training set (if steps = "
                         "0); 0: the dataset's own (8 for images, 600 steps of text)"),
        "seed": Option(int, 0, SEEDS, "seed of model init and data order, 0 to 2**63 - 1"),
        "out": Option(str, "", doc="run directory; empty = runs/<strategy>-<time>"),
        "eval_every": Option(int, 500, at_least(0), "evaluate every N steps; 0 = at the end"),
        "target_accuracy": Option(float, 0.88, between(0, 1), "a classifier's, for "
                                  "time_to_target; 0 = none (text: run.target_loss)"),
        "target_loss": Option(float, 0.0, at_least(0), "validation loss for time_to_target "
                              "(language models, regressions); 0 = none; set, it is the "
                              "run's target"),
        "accumulate": Option(int, 1, at_least(1), "micro-batches of data.batch_size per "
                             "optimizer step; the workers exchange once per step"),
        "precision": Option(str, "fp32", one_of(PRECISIONS), "forward and backward: fp32 | "
                            "bf16 (autocast, fp32 master weights) | fp16 (CUDA, scaled)"),
        "log_every": Option(int, 1, at_least(1), "write metrics.jsonl every N steps"),
        "tensorboard": Option(bool, True, doc="keep a TensorBoard event file in the run "
                              "directory, live (tensorboard --logdir runs)"),
        "representative": Option(str, "average", one_of(("average", "best", "rank0")),
                                 "the model saved and evaluated"),
        "backend": Option(str, "auto", one_of(("auto", "gloo", "nccl")), "torch.distributed"),
        "timeout": Option(float, 300.0, _timeout, "seconds a collective may wait for a peer "
                          "(at most a week)"),
        "checkpoint_every": Option(int, 0, at_least(0), "write a checkpoint every N steps and "
                                   "at the end; 0 = never (see --resume)"),
        "keep_checkpoints": Option(int, 2, at_least(1), "complete checkpoints kept"),
        "on_failure": Option(str, "shrink", one_of(("shrink", "restart", "stop")),
                             "a worker process dies: the survivors go on in a smaller group "
                             "(allreduce), or every worker restarts from the last checkpoint "
                             "(fastsgd run's own workers), or stop"),
        "max_restarts": Option(int, 3, at_least(0), "restarts of one run (on_failure)"),
        "rejoin": Option(bool, False, doc="a killed worker of sgp or adpsgd, or of dpsgd, "
                         "ps or ltfb (exact codecs), is replaced by a new process, which joins "
                         "from a live worker's state (fastsgd run's own workers, and the "
                         "simulator)"),
        "join": Option(bool, False, doc="a lost worker's place (as for run.rejoin) is "
                       "taken by a process started from outside with fastsgd join RUN_DIR "
                       "(fastsgd run's own workers, one machine)"),
        "max_bad_steps": Option(int, 10, at_least(0), "steps in a row a worker may skip for a "
                                "NaN or inf loss or gradient before the run stops"),
    },
    "data": {
        "name": Option(str, "fashion_mnist", doc="fashion_mnist | idx | digits | synthetic | "
                       "text (bytes of UTF-8 files) | tokens (a file of token ids)"),
        "path": Option(str, "", doc="folder of IDX files (fashion_mnist, idx); files or "
                       "folders of text (text; default: Python's standard library); a "
                       "token file or a folder with train.bin and val.bin (tokens)"),
        "dtype": Option(str, "uint16", one_of(("uint16", "uint32")), "tokens: the ids' type"),
        "vocab": Option(int, 0, at_least(0), "tokens: the vocabulary's size; 0: the "
                        "largest id + 1 (text: 256, bytes)"),
        "batch_size": Option(int, 32, at_least(1), "per worker"),
    },
    "model": {
        "name": Option(str, "lenet", doc="mlp | lenet | resnet20 | gpt | module:Name (no "
                       "arguments)"),
        "layers": Option(int, 4, at_least(1), "gpt: transformer blocks"),
        "heads": Option(int, 4, at_least(1), "gpt: attention heads (divide model.width)"),
        "width": Option(int, 128, at_least(1), "gpt: embedding width"),
        "context": Option(int, 128, at_least(1), "gpt: tokens a sequence holds"),
        "dropout": Option(float, 0.0, _below_one, "gpt: dropout on the embeddings, the "
                          "attention weights and each block's outputs, in training"),
        "step": Option(str, "cross_entropy",
                       doc="loss of a batch: cross_entropy (next-token on text, mean "
                       "squared error on a regression's data) | model_loss (the model's "
                       "own: JAX, packed) | module:function(model, batch)"),
        "evaluate": Option(str, "accuracy", doc="test metrics: accuracy | "
                           "module:function(model, dataset, device) -> (accuracy, loss)"),
        "packed": Option(str, "", doc="a job archive from fastsgd pack (.fsj): its model, "
                         "step and initial parameters (then name and step are 'packed')"),
    },
    "optimizer": {
        "name": Option(str, "sgd", _optimizer_name,
                       "sgd | adam | adamw | module:Class (other keys: its keyword arguments)"),
        "lr": Option(float, 0.05, positive),
        "momentum": Option(float, 0.9, between(0, 1)),
        "weight_decay": Option(float, 0.0, at_least(0)),
        "nesterov": Option(bool, False),
        "betas": Option(list, [0.9, 0.999], _betas, "adam, adamw: (beta1, beta2)"),
        "schedule": Option(str, "constant", one_of(SCHEDULES), "the learning rate over the "
                           "steps, after warmup: constant | linear | cosine (to min_lr) | "
                           "step (times decay_factor every decay_every steps)"),
        "warmup": Option(int, 0, at_least(0), "steps of linear warmup from 0 to lr"),
        "min_lr": Option(float, 0.0, at_least(0), "linear, cosine: the last step's lr"),
        "decay_every": Option(int, 0, at_least(0), "step: steps between decays; 0: a third "
                              "of the run"),
        "decay_factor": Option(float, 0.1, between(0, 1), "step: what each decay multiplies "
                               "the lr by"),
        "clip_norm": Option(float, 0.0, at_least(0), "clip the gradient's global norm to "
                            "this before each update; 0: off"),
    },
    "strategy": {"name": Option(str, "allreduce", doc="see fastsgd.strategies")},
    "compression": {"name": Option(str, "none", doc="see fastsgd.compress")},
    "compute": {  # the simulator's compute model; slowdown and stragglers act on real runs too
        "model": Option(str, "profile", one_of(("profile", "fixed", "measured")),
                        "simulated compute: profile | fixed | measured (docs/simulator.md)"),
        "step_time": _time("fixed: forward + backward of one optimizer step (all its "
                           "run.accumulate micro-batches), charged 1:2, e.g. 25ms"),
        "forward": _time("time of one optimizer step's forward passes (run.accumulate of "
                         "them; profile measures it)"),
        "backward": _time("time of one optimizer step's backward passes (run.accumulate of "
                          "them; profile measures it)"),
        "update": _time("time of one optimizer step (profile measures it)"),
        "codec": _time("time to encode + decode one whole gradient (profile measures it); "
                       "charged for what the strategy encodes"),
        "strategy": _time("time of the strategy's own work in one round over the whole "
                          "model: an average, an outer step (profile measures it); charged "
                          "for the share a round covers"),
        "reduce_bandwidth": Option(str, "", bandwidth_check, "rate of adding a received vector "
                                   "into one's own, e.g. 10GB (profile measures it)"),
        "slowdown": Option(list, [], _slowdowns, "per-worker compute factors, e.g. [1, 1, 1, 3]"),
        "straggler_prob": Option(float, 0.0, _below_one, "chance a worker's step is slow"),
        "straggler_factor": Option(float, 4.0, between(1, MAX_FACTOR),
                                   "how much slower that step is"),
        # at most 2: the noise's median is exp(-sigma^2/2), 0.14 at 2 (one phase in 1000 at
        # 65x the mean; coefficient of variation 7), at 10 e^-50: every phase rounded to 0 ns
        "sigma": Option(float, 0.0, between(0, 2), "log-normal noise on every step's compute "
                        "(0 to 2)"),
        "seed": Option(int, -1, _seed_or_run, "seed of the stragglers' and the noise's draws; "
                       "-1: run.seed"),
        "trace": Option(str, "", doc="CSV: each worker's windows, speed, bandwidth"),
        "lanes": Option(int, -1, at_least(-1), "simulator: threads that compute workers' "
                        "steps beside its scheduler, same results (-1: one per core)"),
        "profiled": Option(dict, {}, _profiled, "written by profile: what its times were "
                           "measured for, and the times (another job profiles again)"),
    },
    "network": {  # the simulated network (docs/simulator.md)
        "bandwidth": Option(str, "10Gbit", bandwidth_check, "each worker's NIC, each way"),
        "latency": _time("per-message latency between nodes", "50us"),
        "jitter": _time("extra random delay of a message between nodes, up to e.g. 5ms",
                        "0s"),
        "seed": Option(int, -1, _seed_or_run, "seed of the jitter's and the loss's draws; "
                       "-1: run.seed"),
        "workers_per_node": Option(int, 1, at_least(1), "workers sharing a node"),
        "intra_bandwidth": Option(str, "100Gbit", bandwidth_check, "between workers of a node"),
        "intra_latency": _time("between workers of a node", "2us"),
        "bandwidths": Option(dict, {}, _bandwidths, 'per-worker NICs, e.g. {3 = "10Mbit"}'),
        "loss": Option(float, 0.0, _below_one, "probability that a message is lost"),
        "rto": _time("TCP retransmission timeout after a loss", "200ms"),
        "mtu": Option(int, 1500, _mtu, "Ethernet frame size between nodes; 0: payload only"),
    },
    "faults": {  # the simulator's faults (docs/simulator.md, "Faults")
        "crash": Option(list, [], _crashes, 'workers that crash, e.g. [{worker = 3, at = '
                        '"10s"}] or [{worker = 3, step = 500}]; times on the simulation\'s '
                        'clock, from its start (setup included)'),
        "detect": _time("how long the survivors take to notice a crash", "1s"),
        "restart": _time("run.rejoin: how long a new process takes to start once a loss is "
                         "noticed", "2s"),
        "down": Option(list, [], _crashes, 'links down for a while, e.g. [{worker = 3, '
                       'from = "5s", to = "8s"}], on the same clock'),
    },
}
