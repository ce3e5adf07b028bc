"""Tests of minitfm.training.stops: a signal while training stops the run, never inside an update or a
save, and once stopping, further signals are counted and ignored."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minitfm.workers import distributed
from minitfm.cli import reporting
from minitfm.training import stops

ROOT = Path(__file__).resolve().parents[1]


def send(signum=signal.SIGINT):
    os.kill(os.getpid(), signum)


def test_ctrl_c_during_an_update_waits_for_its_end():
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with stops.interrupts_deferred():
            send()
            finished.append(True)
    assert finished == [True]


def test_a_signal_outside_a_held_block_stops_at_once_and_later_ones_are_ignored():
    with stops.StopRequests() as requests:
        with pytest.raises(KeyboardInterrupt):
            send(signal.SIGTERM)
        send()                                  # the run is stopping already: ignored
        send(signal.SIGHUP)
    assert requests.signum == signal.SIGTERM and requests.ignored == 2


def test_interrupts_deferred_holds_the_active_requests():
    """Inside a run, a deferred block records the signal on the run's requests and raises once,
    at the end of the block; the run sees which signal stopped it."""
    with stops.StopRequests() as requests:
        with pytest.raises(KeyboardInterrupt):
            with stops.interrupts_deferred(), stops.interrupts_deferred():   # nested: one raise
                send(signal.SIGTERM)
                assert requests.signum == signal.SIGTERM
    assert requests.ignored == 0


def test_a_held_signal_stops_a_block_with_stop_points_at_its_next_one_once():
    """A file written through code a signal must not cut (zipfile's): the signal waits for the
    block's next stop point, raises there once, and the clean-up runs on, never cut."""
    reached = []
    with stops.StopRequests() as requests:
        with pytest.raises(KeyboardInterrupt):
            with stops.interrupts_deferred(stop_points=True):
                stops.stop_point()                  # no signal yet
                send(signal.SIGTERM)
                reached.append("after the signal")
                try:
                    stops.stop_point()
                finally:
                    stops.stop_point()              # the clean-up's writes: raised once
                    send()                          # ignored: stopping already
                    reached.append("clean-up")
    assert reached == ["after the signal", "clean-up"]
    assert requests.signum == signal.SIGTERM and requests.ignored == 1


def test_stop_points_inside_a_held_save_never_cut_it_short():
    """A training run's save holds its signals to its end: the stop points of the archive it
    writes raise nothing, nor do they where signals are only recorded (``always_held``)."""
    finished = []
    with stops.StopRequests() as requests:
        with pytest.raises(KeyboardInterrupt):
            with requests.held(), stops.interrupts_deferred(stop_points=True):
                send()
                stops.stop_point()
                finished.append(True)
    assert finished == [True]
    with stops.StopRequests(always_held=True) as requests:
        with stops.interrupts_deferred(stop_points=True):
            send()
            stops.stop_point()
    assert requests.signum == signal.SIGINT
    stops.stop_point()                              # outside any StopRequests: nothing


def test_always_held_records_without_raising():
    with stops.StopRequests(always_held=True) as requests:
        send(signal.SIGTERM)
        with requests.held():
            pass
    assert requests.signum == signal.SIGTERM


def test_stopping_ignores_every_later_signal():
    with stops.StopRequests() as requests:
        requests.stopping()
        send(signal.SIGTERM)
        with requests.held():
            pass
    assert requests.signum == signal.SIGINT and requests.ignored == 1


def swallowed(signum=signal.SIGINT):
    """A signal whose KeyboardInterrupt is lost on its way, as in a library's code that clears
    the errors of what it calls (NumPy's random module did so, imported on a first draw)."""
    try:
        send(signum)
    except KeyboardInterrupt:
        pass


def test_a_stop_lost_on_its_way_is_raised_again_where_work_goes_on():
    stops.raise_if_lost()                       # outside any run: nothing to raise
    with stops.StopRequests() as requests:
        stops.raise_if_lost()                   # no signal yet
        swallowed(signal.SIGTERM)
        with requests.held():
            stops.raise_if_lost()               # never inside an update or a save
        with pytest.raises(KeyboardInterrupt):
            stops.raise_if_lost()
        requests.stopping()
        stops.raise_if_lost()                   # stopping: raised once is enough
    assert requests.signum == signal.SIGTERM


def test_a_command_whose_ctrl_c_was_lost_stops_at_its_next_line(capsys):
    printed = []

    def run():
        swallowed()
        for n in range(1000):
            print(n)
            printed.append(n)
        return 0
    assert reporting.report_errors(run) == 130
    out, err = capsys.readouterr()
    assert printed == [] and out == "" and err == "interrupted\n"


def test_the_previous_handlers_come_back():
    before = {signum: signal.getsignal(signum) for signum in stops.STOP_SIGNALS}
    with stops.StopRequests():
        assert signal.getsignal(signal.SIGINT) is not before[signal.SIGINT]
    assert {signum: signal.getsignal(signum) for signum in stops.STOP_SIGNALS} == before
    assert stops._active is None


def test_workers_stop_together_only_when_one_asks():
    world = distributed.world()                 # one worker: its own request is everyone's
    with stops.StopRequests(always_held=True) as requests:
        stops.stop_if_any_worker_asks(world, requests)          # nobody asked: carry on
        send(signal.SIGHUP)
        with pytest.raises(stops.AgreedStop) as agreed:
            stops.stop_if_any_worker_asks(world, requests)
    assert agreed.value.requests == {0: signal.SIGHUP}
    assert "worker 0 got SIGHUP" in str(agreed.value)
    assert isinstance(agreed.value, KeyboardInterrupt)


def test_describe_signal():
    assert stops.describe_signal(signal.SIGINT) == "interrupted"
    assert stops.describe_signal(signal.SIGTERM) == "stopped by SIGTERM"


def test_a_command_ended_by_a_signal_ignores_late_ones_while_it_exits(monkeypatch):
    """An impatient repeat that lands after the command has returned, while the process shuts
    down, no longer kills it by the signal (status -2 and a traceback, where 130 was decided);
    once the process would have exited, the handler before the command does its work again."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)   # SIG_IGN in a background job

    def run():
        os.kill(os.getpid(), signal.SIGINT)
        return 0
    try:
        assert reporting.report_errors(run) == 130
        os.kill(os.getpid(), signal.SIGINT)     # late: ignored
        lingering = signal.getsignal(signal.SIGINT)
        monkeypatch.setattr(lingering, "until", 0.0)
        with pytest.raises(KeyboardInterrupt):  # later: default_int_handler's again
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                time.sleep(0.001)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with stops.StopRequests(linger=True):   # one that ends well sets them back
            pass
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_command_ended_by_a_signal_exits_with_it_ignored():
    """Python puts the default handlers back as it finalizes, where a late Ctrl-C killed the
    process by the signal (-2, not 130): one that ignores it is left alone, and is set at exit."""
    program = """if True:
        import atexit, os, signal, sys
        atexit.register(lambda: print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN))
        from minitfm.cli import reporting
        def run():
            os.kill(os.getpid(), signal.SIGINT)
            return 0
        sys.exit(reporting.report_errors(run))
    """
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (done.returncode, done.stdout, done.stderr) == (130, "True\n", "interrupted\n")
