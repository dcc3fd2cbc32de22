"""tail.py: the one reader of growing files (job output, rank logs) and of a file's last lines."""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import given, settings, strategies as st

from envlayers.phases import PhaseTracker
from envlayers.tail import Tail, last_lines
from srcscan import lines_matching


def test_read_gives_only_what_was_added_and_survives_truncation(tmp_path):
    path = tmp_path / "log"
    tail = Tail(path)
    assert tail.read() == ""  # no file yet
    path.write_text("one\ntw")
    assert tail.read() == "one\ntw"
    with path.open("a") as fh:
        fh.write("o\n")
    assert tail.read() == "o\n"
    path.write_text("x\n")  # truncated and written again: shorter than what was read
    assert tail.read() == "x\n"


def test_a_replaced_file_is_read_from_its_start(tmp_path):
    path = tmp_path / "log"
    path.write_text("first run, a long line\n")
    tail = Tail(path)
    assert tail.lines() == ["first run, a long line"]
    new = tmp_path / "log.new"
    new.write_text("second run, longer than the first one was\nand more\n")
    os.replace(new, path)  # rotated: another file at the same path, not shorter
    assert tail.lines() == ["second run, longer than the first one was", "and more"]


def test_lines_gives_each_whole_line_once_and_holds_a_cut_one(tmp_path):
    log = tmp_path / "server-0.log"
    tail = Tail(log)
    assert tail.lines() == []
    log.write_bytes(b"one\ntw")
    assert tail.lines() == ["one"]
    with open(log, "ab") as fh:
        fh.write(b"o\nthree\n")
    assert tail.lines() == ["two", "three"]
    assert tail.lines() == [] and tail.rest() == ""
    with open(log, "ab") as fh:
        fh.write(b"no newline")
    assert tail.lines() == [] and tail.rest() == "no newline" and tail.rest() == ""


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=30), max_size=8),
       st.integers(min_value=1, max_value=9), st.integers(min_value=1, max_value=40))
def test_lines_in_any_chunking_are_the_file_lines(tmp_path_factory, lines, chunk, write_size):
    """Written in pieces of any size, read in chunks of any size: the same lines, multi-byte characters
    whole (a UTF-8 sequence cut by a read is joined before it is decoded)."""
    path = tmp_path_factory.mktemp("tail") / "log"
    data = "".join(line.replace("\n", " ") + "\n" for line in lines).encode()
    tail, got = Tail(path, chunk=chunk), []
    path.write_bytes(b"")
    for i in range(0, len(data), write_size):
        with open(path, "ab") as fh:
            fh.write(data[i:i + write_size])
        for _read in range(len(data) + 2):  # each read takes at least a byte: a stuck offset fails, not hangs
            got += tail.lines()
            if tail.offset == path.stat().st_size:
                break
        else:
            pytest.fail(f"the offset stopped at {tail.offset} of {path.stat().st_size}")
    assert got == [line.replace("\n", " ") for line in lines]


def test_a_bounded_read_and_a_bounded_held_line(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"a" * 100 + b"\nb\n")
    tail = Tail(path, chunk=40, max_line=10)
    assert tail.lines() == [] and tail.offset == 40
    assert tail.lines() == [] and tail.offset == 80
    assert tail.lines() == ["a" * 30, "b"]  # of the 80 bytes held, their last 10: the line's end


def test_first_read_from_the_end_and_line_start(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"0123456789\nabcdefghij\n")
    assert Tail(path, max_first_read=5).read() == "ghij\n"
    taking_over = Tail(path, start=14, line_start=True)  # byte 14 is inside "abcdefghij"
    assert taking_over.lines() == ["abcdefghij"]
    assert Tail(path, start=14).lines() == ["defghij"]


def test_phases_across_a_utf8_sequence_split_between_reads(tmp_path):
    path = tmp_path / "server-0.log"
    path.write_bytes(("[2026-11-30 14:00:13 TP0] Load weight begin. avail mem=106.52 GB \u2713\n"
                      "Capturing batches (bs=1 avail_mem=38.07 GB): 100%|\u2588\u2588\u2588| 52/52\n"
                      "[x] The server is fired up and ready to roll!\n").encode())
    tail, tracker = Tail(path, chunk=7), PhaseTracker()  # 7-byte reads cut the multi-byte characters
    for _ in range(100):
        tracker.feed_lines(tail.lines())
    assert [p.name for p in tracker.phases] == ["loading", "ready"]
    assert tracker.phases[0].details == {"avail_mem_gb": 106.52}


def test_last_lines_and_last(tmp_path):
    path = tmp_path / "log"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert last_lines(path, 3, step=16) == ["line 997", "line 998", "line 999"]
    assert last_lines(path, 0) == []
    tail = Tail(path)
    assert tail.last(2) == ["line 998", "line 999"]
    with path.open("a") as fh:
        fh.write("line 1000\n")
    assert tail.lines() == ["line 1000"]  # on from where last() stopped
    assert Tail(tmp_path / "absent").last(3) == []


# a growing file is read through tail.py only
_BY_HAND = re.compile(r"\.seek\(|\.tell\(\)|SEEK_END")
_ALLOWED = {"tail.py"}


def test_no_module_follows_a_file_by_hand():
    assert lines_matching(_BY_HAND, _ALLOWED, ()) == []


@pytest.mark.parametrize("line", ["fh.seek(self.offset)", "offset = fh.tell()", "fh.seek(0, os.SEEK_END)"])
def test_the_tail_check_sees_a_file_followed_by_hand(line):
    assert _BY_HAND.search(line)


def test_read_gives_what_the_read_itself_holds_or_drops(tmp_path):
    log = tmp_path / "log"
    log.write_bytes(b"abcdefghij\n")
    assert Tail(log, start=3, line_start=True).read() == "abcdefghij\n"  # the line's start, found by this read
    tail = Tail(log)
    log.write_bytes(b"ab")
    assert tail.lines() == [] and tail.offset == 2  # "ab" held: an unfinished line
    (tmp_path / "new").write_bytes(b"x\n")
    (tmp_path / "new").replace(log)  # replaced by another file: what was held belonged to the old one
    assert tail.read() == "x\n"
