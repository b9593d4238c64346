"""The runtime's row scheduler, driven by a counting run with no model behind it."""
import pytest

from ostinato.runtime import RowScheduler, SlotTable, bucket_for, buckets_up_to, store_at


class CountdownRun(SlotTable):
    """Each request is a number of steps; one advance takes one step off every busy slot."""

    def __init__(self, key, slots, log):
        super().__init__(slots)
        self.key, self.log = key, log
        log.append(("open", key))

    def admit(self, items):
        slots = self.take(len(items))
        for slot, steps in zip(slots, items):
            self.occupy(slot, [steps, steps])
        self.log.append(("admit", self.key, list(items)))
        return slots

    def advance(self, refill):
        self.log.append(("advance", refill))
        for slot in self.slots():
            self[slot][0] -= 1

    def evict(self, slot):
        self.release(slot)

    def collect(self):
        finished = {slot: (self.key, value[1]) for slot, value in self.items() if value[0] <= 0}
        for slot in finished:
            self.release(slot)
        return finished


def _scheduler(slots, log):
    return RowScheduler(lambda key: CountdownRun(key, slots, log))


def test_a_finished_row_is_refilled_at_once():
    log, results = [], {}
    scheduler = _scheduler(2, log)
    for name, steps in (("a", 3), ("b", 1), ("c", 1), ("d", 2)):
        scheduler.submit("k", steps, lambda r, e, name=name: results.setdefault(name, (r, e, len(log))))
    scheduler.run_until_idle()
    # a and b start together; b ends after one step and c takes its row, then d takes c's
    admits = [entry for entry in log if entry[0] == "admit"]
    assert admits == [("admit", "k", [3, 1]), ("admit", "k", [1]), ("admit", "k", [2])]
    assert {name: r for name, (r, e, _) in results.items()} == {"a": ("k", 3), "b": ("k", 1), "c": ("k", 1), "d": ("k", 2)}
    assert all(e is None for _, e, _ in results.values())
    assert sum(1 for entry in log if entry[0] == "advance") == 4  # 3 + 1 + ... : a, then d's second step
    assert scheduler.idle


def test_the_refill_hint_says_whether_requests_of_this_run_wait():
    log = []
    scheduler = _scheduler(1, log)
    scheduler.submit("k", 2, lambda r, e: None)
    scheduler.submit("k", 1, lambda r, e: None)
    scheduler.run_until_idle()
    assert [entry[1] for entry in log if entry[0] == "advance"] == [True, True, False]


def test_other_options_wait_for_the_run_to_drain_and_keep_their_order():
    log, order = [], []
    scheduler = _scheduler(4, log)
    for key, steps in (("x", 2), ("y", 1), ("x", 1)):
        scheduler.submit(key, steps, lambda r, e: order.append(r))
    scheduler.run_until_idle()
    opens = [entry[1] for entry in log if entry[0] == "open"]
    # the second "x" is behind "y" in the queue: it does not jump it, so x runs twice
    assert opens == ["x", "y", "x"]
    assert order == [("x", 2), ("y", 1), ("x", 1)]


def test_cancel_drops_a_waiting_request_and_frees_an_admitted_one():
    log, done = [], []
    scheduler = _scheduler(1, log)
    first = scheduler.submit("k", 5, lambda r, e: done.append("first"))
    second = scheduler.submit("k", 1, lambda r, e: done.append("second"))
    third = scheduler.submit("k", 1, lambda r, e: done.append("third"))
    scheduler.cancel(second)
    scheduler.step()  # admits first, one step
    scheduler.cancel(first)  # the run can release: its row goes to the next request at once
    scheduler.run_until_idle()
    assert done == ["third"]
    assert [entry[2] for entry in log if entry[0] == "admit"] == [[5], [1]]
    assert third.cancelled is False and first.cancelled and second.cancelled


def test_fail_all_hands_the_error_to_every_request():
    results = [None] * 3
    scheduler = _scheduler(1, [])
    for i in range(3):
        scheduler.submit("k", 4, store_at(results, i))
    scheduler.step()
    error = RuntimeError("device lost")
    scheduler.fail_all(error)
    assert results == [error, error, error] and scheduler.idle


def test_slot_table_takes_the_lowest_free_slots():
    table = SlotTable(3)
    assert table.take(2) == [0, 1]
    table.occupy(0, "a")
    table.occupy(1, "b")
    table.release(0)
    assert table.free_slots == 2 and table.take(1) == [0]
    with pytest.raises(ValueError):
        table.take(5)


def test_slot_table_extent_reaches_the_last_busy_slot():
    table = SlotTable(4)
    assert table.extent() == 0
    table.take(3)
    table.occupy(0, "a")
    table.occupy(2, "c")
    assert table.extent() == 3
    table.release(2)
    assert table.extent() == 1


def test_buckets():
    assert buckets_up_to(5) == (1, 2, 4, 5)
    assert buckets_up_to(16) == (1, 2, 4, 8, 16)
    assert buckets_up_to(100, (1, 8, 64)) == (1, 8, 64, 100)
    assert bucket_for(3, buckets_up_to(5)) == 4
    assert bucket_for(5, buckets_up_to(5)) == 5
    with pytest.raises(ValueError):
        buckets_up_to(0)


class DeferredRun(CountdownRun):
    """A run whose advance finishes on a pretend device: ``ready`` only once the test says so; it
    admits while advancing and can be asked to stop early."""

    admits_while_advancing = True

    def __init__(self, key, slots, log):
        super().__init__(key, slots, log)
        self.ready, self.stepped = True, set()

    def admit(self, items):
        slots = super().admit(items)
        self.stepped -= set(slots)
        return slots

    def advance(self, refill):
        super().advance(refill)
        self.ready, self.stepped = False, set(self.slots())

    def stop_soon(self):
        self.log.append(("stop_soon",))

    def collect(self):
        finished = {slot: (self.key, value[1]) for slot, value in self.items()
                    if value[0] <= 0 and slot in self.stepped}
        for slot in finished:
            self.release(slot)
        return finished


def test_admission_while_an_advance_runs_waits_for_the_next_one():
    """admit / advance / collect one at a time, as a server's engine drives them: a request admitted
    while the device is still on an advance asks the run to stop early, is not reported by that
    advance's collect, and steps from the next advance on; no run is opened while advancing."""
    log, results = [], {}
    scheduler = RowScheduler(lambda key: DeferredRun(key, 2, log))
    done = lambda name: lambda r, e: results.setdefault(name, r)  # noqa: E731
    scheduler.submit("k", 1, done("a"))
    assert scheduler.admit(while_advancing=True) == 0  # no run is open: none is opened mid-advance
    assert scheduler.admit() == 1 and scheduler.advance()
    run = scheduler._run
    assert not scheduler.ready
    scheduler.submit("k", 0, done("b"))  # would count as finished at once, were it collected now
    assert scheduler.admit(while_advancing=True) == 1
    assert log[-1] == ("stop_soon",)
    run.ready = True
    assert scheduler.ready and scheduler.collect() == 1  # a only: b came after that advance
    assert results == {"a": ("k", 1)}
    assert scheduler.advance() and scheduler.collect() == 1
    assert results == {"a": ("k", 1), "b": ("k", 0)} and scheduler.idle


def test_a_run_that_cannot_admit_while_advancing_is_left_alone():
    log = []
    scheduler = _scheduler(2, log)
    scheduler.submit("k", 2, lambda r, e: None)
    scheduler.admit()
    scheduler.advance()
    scheduler.submit("k", 1, lambda r, e: None)
    assert scheduler.admit(while_advancing=True) == 0 and scheduler.waiting == 1
    assert scheduler.ready  # a run without the property never makes collect wait
    scheduler.collect()
    assert scheduler.admit() == 1


def test_the_queue_is_served_highest_priority_first_in_arrival_order_among_equals():
    log = []
    scheduler = _scheduler(1, log)
    for steps, priority in ((1, 0.0), (2, 5.0), (3, 0.0), (4, 9.0), (5, 5.0)):
        scheduler.submit("k", steps, lambda r, e: None, priority=priority)
    scheduler.run_until_idle()
    assert [entry[2] for entry in log if entry[0] == "admit"] == [[4], [2], [5], [1], [3]]


def test_a_later_request_of_higher_priority_takes_the_next_free_row():
    log = []
    scheduler = _scheduler(1, log)
    scheduler.submit("k", 2, lambda r, e: None)
    scheduler.submit("k", 1, lambda r, e: None)
    scheduler.step()  # the first is in the row, the second waits
    scheduler.submit("k", 3, lambda r, e: None, priority=1.0)
    scheduler.run_until_idle()
    assert [entry[2] for entry in log if entry[0] == "admit"] == [[2], [3], [1]]


class SpareTimeRun(DeferredRun):
    """A DeferredRun with host work put off for spare time: ``chores`` of it."""

    def __init__(self, key, slots, log, chores=1):
        super().__init__(key, slots, log)
        self.chores = chores

    def use_spare_time(self):
        if not self.chores:
            return False
        self.chores -= 1
        self.log.append(("spare",))
        return True


def test_spare_time_goes_to_the_open_run_if_it_has_work_put_off():
    log = []
    scheduler = RowScheduler(lambda key: SpareTimeRun(key, 2, log))
    assert not scheduler.use_spare_time()  # no run open
    scheduler.submit("k", 2, lambda r, e: None)
    scheduler.admit()
    scheduler.advance()
    assert scheduler.use_spare_time() and log[-1] == ("spare",)
    assert not scheduler.use_spare_time()  # its one chore is done
    run, asked = scheduler._run, len(log)
    run.use_spare_time = lambda: log.append(("asked",)) or False
    assert not scheduler.use_spare_time() and len(log) == asked  # not asked again until it admits
    scheduler.submit("k", 1, lambda r, e: None)
    scheduler.admit(while_advancing=True)
    assert not scheduler.use_spare_time() and log[-1] == ("asked",)
    plain = _scheduler(2, [])
    plain.submit("k", 1, lambda r, e: None)
    plain.admit()
    assert not plain.use_spare_time()  # a run without the method has none
