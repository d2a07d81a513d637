"""Workers that crash in a simulated cluster (`[faults]`), who knows it when, and links
that go down for a while.

A crash is fail-stop: worker r's crash at virtual time T (`at = "10s"`) or at step s
(`step = 10`) takes effect at the first point after it where r has made its optimizer step
and not yet exchanged parameters (the `update` phase): everything r sent before stays on
the wire and arrives; r sends nothing more. r has *left at step k*: it took part in steps
0..k-1 and in the gradient exchange of step k, and in no parameter exchange from step k on.

The survivors learn of it `detect` later (a heartbeat timeout), all at that same virtual
instant, as from a membership service: (r, k) becomes part of every survivor's view. A
worker blocked on r, or waiting for messages, wakes then with `PeerLost`; a collective that
waits for r completes among the survivors. Messages to a dead worker are dropped.

With `run.rejoin = true` a lost worker does not stay lost, as with `fastsgd run`'s own workers
(rejoin.py): once the death is known, the simulated launcher sets the step J a new process
joins at, ahead of every worker (4 steps past the furthest), and starts the new process
`restart` later; it waits for the state that the donor (the lowest worker still running
with a state to give) sends it over the network at the start of J. A message is addressed
to the process standing for its receiver at the sender's step (the roster, roster.py): one
meant for a lost process is lost with it. `crash` may then name a worker more than once:
the n-th entry of a rank is the n-th process standing for it.

A link down (`down = [{worker = 3, from = "5s", to = "8s"}]`) cuts the worker's NIC, both
ways, for that window: nothing is lost, as over TCP, but what it would send waits for the
link to come back, what is sent to it arrives after, and a collective does not run while a
member's link is down.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastsgd.config.units import parse_seconds
from fastsgd.errors import ConfigError
from fastsgd.transport.roster import Roster
from fastsgd.transport.sim.compute import to_ns
from fastsgd.transport.sim.scheduler import Crashed


@dataclass(frozen=True)
class Crash:
    worker: int
    at_ns: int | None = None  # virtual time
    step: int | None = None  # or a step count

    def due(self, now_ns: int, step: int) -> bool:
        if self.step is not None:
            return step >= self.step
        assert self.at_ns is not None
        return now_ns >= self.at_ns


@dataclass(frozen=True)
class Survival:
    """What the run's strategy and codec survive, as the caller reads them from the
    strategy's capabilities (launch/simulate.py: transport/ knows no strategy)."""

    strategy: str  # the strategy's name, for messages
    codec: str  # the codec's name
    kind: str  # the codec's kind
    carries_on: tuple[str, ...] = ()  # codec kinds with which the survivors go on
    rejoins: tuple[str, ...] = ()  # codec kinds with which a new worker takes a lost one's place
    held: int = 0  # ranks 0..held-1 hold what no other rank has (ps's servers): none may crash


@dataclass
class Faults:
    crashes: dict[int, list[Crash]] = field(default_factory=dict)  # rank -> one per process
    detect_ns: int = 1_000_000_000
    down: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # rank -> windows
    restart_ns: int | None = None  # run.rejoin: a new process starts this long after a death

    def back_up(self, rank: int, when: int) -> int:
        """The first time >= `when` at which `rank`'s link is up."""
        for start, end in self.down.get(rank, ()):
            if start <= when < end:
                when = end
        return when

    def clear_window(self, ranks: list[int], start: int, duration: int) -> int:
        """The first time >= `start` from which no link of `ranks` goes down for `duration`
        (a collective needs every member's link all along)."""
        if not self.down:
            return start
        moved = True
        while moved:
            moved = False
            for rank in ranks:
                for down, up in self.down.get(rank, ()):
                    if down < start + duration and start < up:
                        start, moved = up, True
        return start

    @classmethod
    def parse(cls, section: dict, world_size: int, rejoin: bool = False) -> Faults:
        """The `[faults]` section (`rejoin`: run.rejoin); every mistake is one line naming
        the key."""
        detect = to_ns(parse_seconds(section.get("detect", "1s"), "faults.detect"))
        restart = to_ns(parse_seconds(section.get("restart", "2s"), "faults.restart"))
        crashes: dict[int, list[Crash]] = {}
        for i, entry in enumerate(section.get("crash", [])):
            crash = _crash(entry, f"faults.crash[{i}]", world_size)
            if crash.worker in crashes and not rejoin:
                raise ConfigError(f"faults.crash[{i}]: worker {crash.worker} crashes twice "
                                  "(only with run.rejoin = true does a new process take its "
                                  "place)")
            crashes.setdefault(crash.worker, []).append(crash)
        if crashes and len(crashes) >= world_size:
            raise ConfigError(f"faults.crash: all {world_size} workers crash; at least one "
                              "must survive")
        down: dict[int, list[tuple[int, int]]] = {}
        for i, entry in enumerate(section.get("down", [])):
            rank, window = _outage(entry, f"faults.down[{i}]", world_size)
            down.setdefault(rank, []).append(window)
        return cls(crashes, detect, {r: sorted(w) for r, w in down.items()},
                   restart if rejoin else None)

    @property
    def crashing(self) -> bool:
        """Some worker crashes (outages alone lose nobody)."""
        return bool(self.crashes)

    def check_steps(self, total: int) -> None:
        """A crash at a step the run does not reach, in one line."""
        for rank, crashes in sorted(self.crashes.items()):
            for crash in crashes:
                if crash.step is not None and crash.step >= total:
                    raise ConfigError(f"faults.crash: worker {rank} at step {crash.step} is "
                                      f"past the run's last step ({total - 1}): it would "
                                      "never crash")

    def check_run(self, survival: Survival, config: dict) -> None:
        """Refuse, in one line, what cannot carry on after a crash yet."""
        name, kind = survival.strategy, survival.kind
        if self.restart_ns is not None and kind not in survival.rejoins:
            raise ConfigError(f"run.rejoin = true: strategy.name = '{name}' with "
                              f"compression.name = '{survival.codec}' does not take a new "
                              "worker in a lost one's place (sgp and adpsgd do, also with a "
                              "lossy codec; dpsgd, ps and ltfb with an exact one)")
        if not self.crashing:
            return
        if kind not in survival.carries_on:
            what = "" if not survival.carries_on else (
                f" with compression.name = '{survival.codec}'")
            raise ConfigError(f"faults.crash: strategy.name = '{name}'{what} does not carry "
                              "on without a lost worker yet (docs/simulator.md, \"Faults\")")
        first, held = sorted(self.crashes)[0], survival.held
        if first < held:
            raise ConfigError(f"faults.crash: worker {first} holds a parameter server shard "
                              f"(strategy.servers = {held}); crash a worker >= {held}")
        if config["run"]["checkpoint_every"]:
            raise ConfigError("faults.crash: runs with crashes cannot be checkpointed yet; "
                              "set run.checkpoint_every = 0")


def _crash(entry: object, key: str, world_size: int) -> Crash:
    if not isinstance(entry, dict) or set(entry) - {"worker", "at", "step"}:
        raise ConfigError(f'{key} must be a table like {{worker = 3, at = "10s"}} or '
                          "{worker = 3, step = 500}")
    worker = entry.get("worker")
    if not isinstance(worker, int) or isinstance(worker, bool) or not 0 <= worker < world_size:
        raise ConfigError(f"{key}.worker must be a worker rank in 0..{world_size - 1}, "
                          f"got {worker!r}")
    if ("at" in entry) == ("step" in entry):
        raise ConfigError(f"{key} needs exactly one of at (a time) or step")
    if "step" in entry:
        step = entry["step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ConfigError(f"{key}.step must be a step count >= 0, got {step!r}")
        return Crash(worker, step=step)
    return Crash(worker, at_ns=to_ns(parse_seconds(entry["at"], f"{key}.at")))


__all__ = ["Crash", "Crashed", "Faults", "Membership"]


def _outage(entry: object, key: str, world_size: int) -> tuple[int, tuple[int, int]]:
    if not isinstance(entry, dict) or set(entry) != {"worker", "from", "to"}:
        raise ConfigError(f'{key} must be a table like {{worker = 3, from = "5s", to = "8s"}}')
    worker = entry["worker"]
    if not isinstance(worker, int) or isinstance(worker, bool) or not 0 <= worker < world_size:
        raise ConfigError(f"{key}.worker must be a worker rank in 0..{world_size - 1}, "
                          f"got {worker!r}")
    down = to_ns(parse_seconds(entry["from"], f"{key}.from"))
    up = to_ns(parse_seconds(entry["to"], f"{key}.to"))
    if up <= down:
        raise ConfigError(f"{key}: to ({entry['to']}) must come after from ({entry['from']})")
    return worker, (down, up)


class Membership:
    """Who has crashed (the truth), who the survivors know has (their view), and the
    processes that took lost ones' places (run.rejoin)."""

    def __init__(self, faults: Faults, world_size: int):
        self.faults = faults
        self.members = list(range(world_size))  # the survivors' view, kept up to date
        self.dead: dict[int, int] = {}  # rank -> step its process left at (not replaced)
        self.known: dict[int, int] = {}  # the part of `dead` the survivors have learnt
        self.when: dict[int, float] = {}  # rank -> virtual time of its crash (s)
        self.since = [0] * world_size  # the step the process standing for each rank joined at
        self.donor = [0] * world_size  # the rank the latest new process took its state from
        self.processes = [0] * world_size  # how many processes replaced each rank
        self.history = {r: [[0, None]] for r in range(world_size)}  # rank -> [since, left]
        self.roster = Roster()  # the survivors' view of returns, by step (roster.py)
        self.departures: dict[int, list[tuple[int, float]]] = {}  # known, by rank

    def crash_due(self, rank: int, now_ns: int, step: int) -> bool:
        crashes = self.faults.crashes.get(rank, ())
        turn = self.processes[rank]
        return turn < len(crashes) and rank not in self.dead and crashes[turn].due(now_ns, step)

    def die(self, rank: int, step: int, now_ns: int) -> None:
        self.dead[rank] = step
        self.when[rank] = now_ns / 1e9
        self.history[rank][-1][1] = step

    def learn(self, rank: int) -> None:
        self.known[rank] = self.dead[rank]
        self.departures.setdefault(rank, []).append((self.dead[rank], self.when[rank]))
        self.members = [r for r in self.members if r != rank]

    def back(self, rank: int, step: int, donor: int) -> None:
        """A new process stands for lost `rank` from `step` on, from `donor`'s state."""
        del self.dead[rank], self.known[rank]
        self.since[rank], self.donor[rank] = step, donor
        self.processes[rank] += 1
        self.history[rank].append([step, None])
        self.roster.returns.setdefault(rank, []).append(step)
        self.members = sorted([*self.members, rank])

    def alive(self, rank: int) -> bool:
        return rank not in self.dead

    def accepts(self, rank: int, since: int) -> bool:
        """Is the process a message was addressed to (by its join step) the one standing for
        `rank`, and running (or on its way)?"""
        return rank not in self.dead and self.since[rank] == since

    def never_happened(self) -> list[tuple[int, Crash]]:
        """The crashes the run ended before (rank, crash): a time past its end."""
        return [(rank, crash) for rank, crashes in sorted(self.faults.crashes.items())
                for crash in crashes[self.processes[rank] + (rank in self.dead):]]

    def handing_in(self, step: int) -> int:
        """How many workers hand in their model at `step` (after step - 1): those whose
        process standing then has not left before."""
        count = 0
        for processes in self.history.values():
            standing = [left for since, left in processes if since < step]
            count += bool(standing) and (standing[-1] is None or standing[-1] >= step)
        return count
