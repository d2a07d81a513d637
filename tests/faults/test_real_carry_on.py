"""Real processes (`fastsgd run`): a worker of ps, adpsgd, sgp or ltfb is killed (-9)
halfway; the survivors notice at once (its connection ends), carry on without it and
finish, and the summary lists the lost worker."""

import json
import os
import subprocess
import sys

import pytest

STEPS, KILLED_AT = 120, 60
COMMON = {"data.name": "digits", "model.name": "mlp", "run.workers": 4,
          "run.steps": STEPS, "run.eval_every": 40}


def _run(out, strategy, **env_vars):
    name, _, topology = strategy.partition("-")
    sets = {**COMMON, "strategy.name": name, "run.out": str(out)}
    if topology:
        sets["strategy.topology"] = topology
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return subprocess.run([sys.executable, "-m", "fastsgd", "run", "--quiet", "--no-report", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env_vars})


CASES = {  # id: (strategy, the killed rank, where the kill is, the steps it had done)
    **{s: (s, 2, f"{KILLED_AT}", KILLED_AT) for s in ("sgp", "adpsgd", "ps", "ltfb")},
    # (plain dpsgd-ring is the case below with the kill between its sends, and worker 0's)
    "dpsgd-torus": ("dpsgd-torus", 2, f"{KILLED_AT}", KILLED_AT),
    # its message of the round reaches worker 3, not worker 1: the two close the ring
    # around it one round apart (transport/exchange.py)
    "dpsgd-ring-between-its-sends": ("dpsgd-ring", 2, f"{KILLED_AT}:exchange", KILLED_AT - 1),
    # in its first step, before its first exchange, after the start-up's collectives
    # (which do not say how far it got): it left at step 0 (its peers waited for good)
    "dpsgd-ring-in-its-first-step": ("dpsgd-ring", 2, "1:parameters", 0),
    # worker 0 evaluates and writes the results: worker 1 takes over, with its eval log
    "sgp-worker-0": ("sgp", 0, f"{KILLED_AT}", KILLED_AT),
    "dpsgd-ring-worker-0": ("dpsgd-ring", 0, f"{KILLED_AT}", KILLED_AT),
    # after it evaluated the last step: worker 1 writes the results from its log
    "sgp-worker-0-at-the-end": ("sgp", 0, f"{STEPS}", STEPS),
}


@pytest.mark.multiproc
@pytest.mark.parametrize("case", list(CASES))
def test_the_survivors_carry_on_without_a_killed_worker(case, tmp_path):
    strategy, killed, kill, done_steps = CASES[case]
    done = _run(tmp_path, strategy, FASTSGD_TEST_KILL=f"{killed}:{kill}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.strip() == (f"fastsgd: worker {killed} was killed by signal 9 "
                                   "(SIGKILL); the others carry on without it")
    summary = json.loads((tmp_path / "summary.json").read_text())
    [lost] = summary["lost_workers"]
    assert lost["worker"] == killed and lost["step"] == done_steps
    assert summary["final_accuracy"] > 0.85 and summary["steps"] == STEPS
    assert summary["evaluations"] == STEPS // COMMON["run.eval_every"]
    evals = [json.loads(line) for line in (tmp_path / "eval.jsonl").open()]
    assert [e["step"] for e in evals] == [40, 80, 120]  # one log, whoever wrote it
    ranks = {json.loads(line)["rank"] for line in (tmp_path / "metrics.jsonl").open()
             if json.loads(line)["step"] > min(done_steps + 10, STEPS - 1)}
    assert ranks - {killed} == {0, 1, 2, 3} - {killed}  # the survivors went on to the end
    assert killed not in ranks or done_steps == STEPS



def _truncated(out):
    """Worker 1 sends one whole message of step 5, then dies halfway through the next one's
    frame (step 6). Worker 0 takes the whole one, is told of the loss, and counts the dead
    as having left at step 6: the cut frame was never sent."""
    import torch

    from fastsgd.transport import frames
    from fastsgd.transport.base import PeerLost
    from fastsgd.transport.torch_dist import TorchTransport

    t = TorchTransport("gloo", timeout=60)
    t.carry_on()
    if t.rank == 1:  # straight onto the connection (its sender thread is idle)
        whole, cut = torch.arange(4.0), torch.ones(1000)
        wire = b"".join(frames.header(x, 7, step).numpy().tobytes() + x.numpy().tobytes()
                        for x, step in ((whole, 5), (cut, 6)))
        t._messenger._links[0].sock.sendall(wire[:-2000])
        os._exit(0)  # no goodbye: as kill -9 would
    src, whole = t.wait_message(7)
    try:
        t.wait_message(7)
        lost = None
    except PeerLost as e:
        lost = e.peers
    left = {r: step for r, (step, _) in t.departed().items()}
    torch.save((src, whole.tolist(), lost, left, t.members()), f"{out}/0.pt")
    t.close()


@pytest.mark.multiproc
def test_a_frame_cut_short_by_a_death_is_not_delivered(tmp_path):
    import torch

    from fastsgd.launch.local import launch

    launch(lambda: _truncated(tmp_path), 2)
    assert torch.load(tmp_path / "0.pt") == (1, [0.0, 1.0, 2.0, 3.0], [1], {1: 6}, [0])
