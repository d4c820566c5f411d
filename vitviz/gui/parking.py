"""Worker threads that outlived their window, kept until they have finished.

A QThread destroyed while it runs aborts the process ("QThread: Destroyed while thread is still running"). A
forward pass stops at the next transformer block once the thread is asked to, but what cannot be interrupted (one
slow block, decoding an image, loading a checkpoint) may outlast `WorkerClient.shutdown`'s bounded wait, so a thread
still busy after it is parked instead of dropped. At exit the parked threads are waited for.
"""
from __future__ import annotations

import atexit
import sys

from PySide6.QtCore import QObject, QThread, Slot

EXIT_NOTE_MS = 3000         # at exit, say why the process is still there after this long


class ParkingLot(QObject):
    """Worker threads still running a request after their window's bounded wait, kept until they have finished.

    Dropping the last reference to a running QThread destroys it and aborts the process, so a thread that
    outlives its window is held here with its worker; its `finished` (queued to this GUI-thread object) releases
    it, and `wait_all` at exit waits for what is left.
    """

    def __init__(self) -> None:
        super().__init__()
        self._held: list[tuple[QThread, QObject]] = []

    def __len__(self) -> int:
        return len(self._held)

    def holds(self, thread: QThread) -> bool:
        return any(t is thread for t, _ in self._held)

    def add(self, thread: QThread, worker: QObject) -> None:
        if not self.holds(thread):
            self._held.append((thread, worker))
            thread.finished.connect(self._release)
            if thread.isFinished():     # it finished between the caller's wait and the connection
                self._release()

    @Slot()
    def _release(self) -> None:
        done = self.sender()
        for entry in list(self._held):
            thread = entry[0]
            # a thread that has emitted finished is only cleaning up: the wait is short (and drops the GIL)
            if (thread is done or thread.isFinished()) and thread.wait(5000):
                self._held.remove(entry)

    def wait_all(self) -> None:
        """Wait for every parked thread (at exit, before Python destroys them), saying so when it takes long."""
        for thread, _worker in list(self._held):
            if not thread.wait(EXIT_NOTE_MS):
                sys.stderr.write("vitviz: waiting for the running inference request to finish…\n")
                while not thread.wait(EXIT_NOTE_MS):
                    pass
        self._held.clear()


parking = ParkingLot()
atexit.register(parking.wait_all)
