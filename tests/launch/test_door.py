"""`fastsgd join`'s side of the door (door.attach): what it refuses, in one line, without
waiting for a run that is not there. The joins themselves: tests/faults/test_real_join.py."""

import os
import struct

import pytest

from fastsgd.cli.main import main
from fastsgd.control.interrupt import Stop
from fastsgd.control.slots import HEADER, OLD_MAGIC, Slots
from fastsgd.errors import UserError
from fastsgd.launch.door import Door, attach, started


def test_a_door_whose_launcher_pid_is_another_process_now_is_refused(tmp_path):
    stop = Stop(None, 2, slots=Slots(2, tmp_path / ".door"))
    Door(tmp_path / ".door", steps=6).open(stop, 1234, lambda rank, running: None)
    stop.progress[0] = 1  # its workers are training
    assert attach(tmp_path).slots["pid"] == os.getpid()  # its launcher: this process
    # killed, and its pid is now a live process's that started at another time
    stop.slots["started"] = started(os.getpid()) + 1
    with pytest.raises(UserError, match=f"^the run in {tmp_path} is not running any more "
                                        rf"\(its launcher, pid {os.getpid()}, is gone\)$"):
        attach(tmp_path)


def test_joining_a_file_is_one_line(tmp_path, capsys):
    a_file = tmp_path / "ok.toml"
    a_file.write_text("")
    assert main(["join", str(a_file)]) == 2
    assert capsys.readouterr().err == (f"fastsgd: error: {a_file}: not a run directory (not a "
                                       "folder): fastsgd join takes the folder of a running "
                                       "`fastsgd run`\n")


def test_joining_a_missing_folder_says_so(tmp_path, capsys):
    assert main(["join", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err == f"fastsgd: error: {tmp_path / 'nope'}: no such run directory\n"


def test_a_door_of_an_older_fastsgd_is_refused(tmp_path):
    old = dict.fromkeys(HEADER[:10], 0) | {"magic": OLD_MAGIC, "workers": 2, "closed": 1}
    (tmp_path / ".door").write_bytes(struct.pack("10q", *old.values()) + bytes(8 * 6 * 2))
    with pytest.raises(UserError, match="a run of an older fastsgd made it: join with that"):
        attach(tmp_path)
