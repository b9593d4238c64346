"""The row scheduler: requests flow through a family's rows, and a finished row is refilled at once.

A *run* is a family's set of decoder rows working under one set of options (one graph key
family: the same search, the same rules). It admits requests into free slots (a slot is the
group of rows one request occupies: one row, ``best_of`` samples, K beams), advances every row
with one launch, and hands back the requests that finished since it last looked, freeing their
slots. The scheduler knows nothing of models: it keeps the requests that wait (highest priority
first, a number the caller gives; in arrival order among equals), opens a run for the options of
the request at the head of the queue, keeps that run full, and opens the next run once the
current one drains. Requests with other options wait rather than starve the run
(``transcribe_batch``'s temperature fallbacks, a server's requests with their own options).

A family supplies ``open_run(key) -> run``; a run has:

* ``free_slots``: how many requests it can take now;
* ``busy``: whether any admitted request has not been collected yet;
* ``admit(items) -> [slot]``: load requests into free slots (prefill);
* ``advance(refill)``: one launch that steps every row; ``refill`` says whether requests wait for a
  free slot of this run (on the device loop a run may then stop as soon as a row finishes, and
  otherwise run on until every row has);
* ``collect() -> {slot: result}``: the requests that finished; their slots become free;
* optionally ``evict(slot)``: give a slot back before its request finished (a cancelled request):
  its rows stop stepping and are free at once;
* optionally ``ready`` (a property): whether ``collect`` would return without waiting for the
  device (absent: always), and ``admits_while_advancing``: whether ``admit`` may be called while an
  advance is still running on the device (its work queued behind it; ``collect`` then still reports
  only the requests that advance stepped), and ``stop_soon()``: end that advance early, so the
  requests admitted meanwhile start stepping; ``use_spare_time() -> bool``: host work the run put
  off as it admitted requests, for a moment when the device is busy (a deferred graph capture),
  done while an advance runs; returns whether there was any.

``step`` does one whole round. A thread that has other host work (a server's engine) calls
``admit``, ``advance`` and ``collect`` itself, and works while the device advances (``ready``).

``SlotTable`` is the bookkeeping most runs need for their slots.
"""
from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Callable, Deque, Dict, Generic, Hashable, List, Optional, Protocol, Sequence, TypeVar

T = TypeVar("T")


class Run(Protocol):
    free_slots: int
    busy: bool

    def admit(self, items: Sequence[Any]) -> List[int]: ...

    def advance(self, refill: bool) -> None: ...

    def collect(self) -> Dict[int, Any]: ...


class SlotTable(Generic[T]):
    """The slots of a run: which are free (lowest first), and per busy slot a value the run tracks
    (its first row, a bound on the cache positions it wrote...)."""

    def __init__(self, slots: int):
        self._free = list(range(slots))
        self._busy: Dict[int, T] = {}

    @property
    def busy(self) -> bool:
        return bool(self._busy)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def take(self, count: int) -> List[int]:
        if count > len(self._free):
            raise ValueError(f"{count} requests but only {len(self._free)} free slots in this run")
        taken, self._free = self._free[:count], self._free[count:]
        return taken

    def occupy(self, slot: int, value: T) -> None:
        self._busy[slot] = value

    def release(self, slot: int) -> None:
        del self._busy[slot]
        self._free.append(slot)
        self._free.sort()

    def __getitem__(self, slot: int) -> T:
        return self._busy[slot]

    def __setitem__(self, slot: int, value: T) -> None:
        self._busy[slot] = value

    def __contains__(self, slot: int) -> bool:
        return slot in self._busy

    def items(self):
        return self._busy.items()

    def values(self):
        return self._busy.values()

    def slots(self) -> List[int]:
        return list(self._busy)

    def extent(self) -> int:
        """The slots up to and including the last busy one (0 when none is busy)."""
        return max(self._busy) + 1 if self._busy else 0


class Ticket:
    """One submitted request: ``done(result, error)`` is called once, from the scheduling thread."""

    __slots__ = ("key", "item", "done", "id", "cancelled", "priority")

    def __init__(self, key: Hashable, item: Any, done: Callable[[Any, Optional[BaseException]], None], id: int,
                 priority: float = 0.0):
        self.key, self.item, self.done, self.id = key, item, done, id
        self.cancelled = False
        self.priority = priority


class RowScheduler:
    """Admit waiting requests into free rows, advance all rows with one launch, collect and refill.

    ``open_run(key)`` returns the family's run for requests of option key ``key``. One run is open
    at a time. Not thread-safe: one thread (the one that owns the device) calls ``submit``,
    ``step`` and ``cancel``; callbacks run on that thread.
    """

    def __init__(self, open_run: Callable[[Hashable], Any]):
        self._open_run = open_run
        self._waiting: Deque[Ticket] = deque()
        self._run = None
        self._run_key: Hashable = None
        self._admitted: Dict[int, Ticket] = {}  # slot -> ticket
        self._ids = itertools.count()
        self._put_off = False  # whether the run may have put work off since it last said it had none

    # -- what the callers see --------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        """Requests not yet admitted into rows."""
        return len(self._waiting)

    @property
    def admitted(self) -> int:
        """Requests in rows now."""
        return len(self._admitted)

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._admitted

    def submit(self, key: Hashable, item: Any, done: Callable[[Any, Optional[BaseException]], None],
               priority: float = 0.0) -> Ticket:
        """Queue a request; ``done(result, None)`` is called once it finished. The queue is served
        highest ``priority`` first, and in arrival order among equal priorities."""
        ticket = Ticket(key, item, done, next(self._ids), priority)
        waiting = self._waiting
        if not waiting or waiting[-1].priority >= priority:
            waiting.append(ticket)
        else:
            waiting.insert(next(i for i, t in enumerate(waiting) if t.priority < priority), ticket)
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Drop a request: a waiting one leaves the queue; an admitted one gives its rows back at once
        where the run can (``evict``), else its result is discarded when it finishes. ``done`` is
        not called for it."""
        ticket.cancelled = True
        if ticket in self._waiting:
            self._waiting.remove(ticket)
            return
        for slot, admitted in list(self._admitted.items()):
            if admitted is ticket and hasattr(self._run, "evict"):
                self._run.evict(slot)
                del self._admitted[slot]

    def step(self) -> bool:
        """One round: open a run if needed, admit, advance once, collect. Returns whether work remains."""
        self.admit()
        if self.advance():
            self.collect()
        return not self.idle

    def admit(self, while_advancing: bool = False) -> int:
        """Load waiting requests into the open run's free slots (opening a run for the head request's
        key when none is busy). ``while_advancing``: an advance may still be running on the device;
        then only a run that ``admits_while_advancing`` takes requests, and no run is opened.
        Returns how many were admitted."""
        if while_advancing and not getattr(self._run, "admits_while_advancing", False):
            return 0
        admitted = self._admit(open_run=not while_advancing)
        if admitted and while_advancing and hasattr(self._run, "stop_soon"):
            self._run.stop_soon()  # they step from the next advance on: let it come soon
        return admitted

    def advance(self) -> bool:
        """Launch one advance of the open run if it has busy slots; returns whether it did."""
        run = self._run
        if run is None or not run.busy:
            return False
        run.advance(bool(self._waiting) and self._waiting[0].key == self._run_key)
        return True

    @property
    def ready(self) -> bool:
        """Whether ``collect`` would not wait for the device."""
        return self._run is None or getattr(self._run, "ready", True)

    def use_spare_time(self) -> bool:
        """(While an advance runs on the device) let the open run do host work it put off; returns
        whether it did any. A run puts work off as it admits requests: once it said it had none
        left, it is not asked again before its next admission (an engine asks at every look)."""
        run = self._run
        if not self._put_off or run is None or not hasattr(run, "use_spare_time"):
            return False
        did = bool(run.use_spare_time())
        self._put_off = did
        return did

    def collect(self) -> int:
        """Hand the requests the last advance finished to their callbacks; returns how many."""
        if self._run is None:
            return 0
        finished = self._run.collect()
        for slot, result in finished.items():
            ticket = self._admitted.pop(slot)
            if not ticket.cancelled:
                ticket.done(result, None)
        return len(finished)

    def run_until_idle(self) -> None:
        while self.step():
            pass

    def fail_all(self, error: BaseException) -> None:
        """Hand ``error`` to every waiting and admitted request (the run cannot go on)."""
        tickets = list(self._waiting) + list(self._admitted.values())
        self._waiting.clear()
        self._admitted.clear()
        self._run = None
        for ticket in tickets:
            if not ticket.cancelled:
                ticket.done(None, error)

    # -- inside ------------------------------------------------------------------------------------
    def _admit(self, open_run: bool = True) -> int:
        if not self._waiting:
            return 0
        head = self._waiting[0].key
        if self._run is None or (not self._run.busy and head != self._run_key):
            if not open_run:
                return 0
            self._run = None  # its rows go back before the next run is opened
            self._run_key = head
            self._run = self._open_run(head)
        run = self._run
        batch: List[Ticket] = []
        # In order: a request with other options waits for this run to drain; none behind it jumps it.
        while self._waiting and len(batch) < run.free_slots and self._waiting[0].key == self._run_key:
            batch.append(self._waiting.popleft())
        if batch:
            for slot, ticket in zip(run.admit([t.item for t in batch]), batch):
                self._admitted[slot] = ticket
            self._put_off = True
        return len(batch)


def store_at(results: list, index: int) -> Callable[[Any, Optional[BaseException]], None]:
    """A ``done`` callback that puts a request's result (or its error) at ``results[index]``."""

    def done(result: Any, error: Optional[BaseException]) -> None:
        results[index] = error if error is not None else result

    return done
