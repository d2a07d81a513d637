"""The text of a user's training script whose source must not travel with its archive
(tests write it into a temporary folder; every name, comment and literal in it is unique)."""

SCRIPT = '''
"""Zanzibar training script: the docstring must not travel."""
import torch
import torch.nn.functional as F
from torch import nn

import fastsgd as fs

QUOKKA_MESSAGE = "quokka string literal"


class ZanzibarNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.wombat_hidden = nn.Linear(64, 32)
        self.wombat_out = nn.Linear(32, 10)

    def forward(self, x):
        # narwhal comment in forward
        return self.wombat_out(torch.tanh(self.wombat_hidden(x.flatten(1))))


def pangolin_step(model, batch):
    # axolotl comment in the step
    x, y = batch
    return F.cross_entropy(model(x), y, label_smoothing=0.05) + 0.0 * len(QUOKKA_MESSAGE)


job = fs.Job(model=ZanzibarNet, step=pangolin_step, data="digits",
             options={"run.workers": 2, "run.steps": 30, "run.eval_every": 30,
                      "model.name": "zanzibar_train:ZanzibarNet",
                      "model.step": "zanzibar_train:pangolin_step",
                      "strategy.name": "STRATEGY", "run.out": "source-run"})

if __name__ == "__main__":
    job.run()
'''
# what the archive must not hold: names, comments, literals and the file's own name
SECRETS = ("Zanzibar", "ZanzibarNet", "pangolin_step", "narwhal", "axolotl", "quokka",
           "QUOKKA_MESSAGE", "zanzibar_train", "docstring must not travel")


def write_script(folder, strategy: str = "allreduce"):
    """zanzibar_train.py in `folder`; its path."""
    path = folder / "zanzibar_train.py"
    path.write_text(SCRIPT.replace("STRATEGY", strategy))
    return path
