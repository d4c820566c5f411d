"""The CLI's one terminal progress bar: the images of `vitviz export` and the bytes of a named model's download."""
from __future__ import annotations

import sys
import time
from typing import TextIO

from vitviz.catalog.scan import format_size


class ProgressBar:
    """One line redrawn in place ('\\r') on a stream, fed in one of two ways.

    - `advance()` counts finished images (`vitviz export`): `[#########      ] 3/10  2.1 img/s  ETA 3 s`, redrawn at
      most 10 times a second.
    - Calling it with `(done, total)` bytes makes it the catalog's download callback (`vitviz models --get`,
      `--model NAME`): `[#########      ]  42% 12.4 MB / 30 MB`, or the bare byte count when the size is unknown;
      the line ends by itself at 100 %.

    Args:
        total: the number of images `advance` counts towards (0 for a download).
        stream: where the bar goes (default: stderr).
        enabled: False draws nothing (`--quiet`); `message` still prints.
        tty_only: draw only when `stream` is a terminal (the export's bar; a download's also goes into logs).
    """

    def __init__(self, total: int = 0, stream: TextIO | None = None, enabled: bool = True, tty_only: bool = True,
                 width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.total, self.count, self.width = total, 0, width
        is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled and (is_tty or not tty_only)
        self.start = time.perf_counter()
        self.open_line = False   # something is drawn on the current line and no newline yet
        self._last_draw = 0.0
        self._last_pct = -1
        self._line = ""

    def advance(self, n: int = 1) -> None:
        """Count `n` more images finished (done, skipped or failed) and redraw at most 10 times a second."""
        self.count += n
        now = time.perf_counter()
        if self.enabled and (now - self._last_draw > 0.1 or self.count >= self.total):
            self._last_draw = now
            self._draw_count(now - self.start)

    def __call__(self, done: int, total: int | None) -> None:
        """`done` of `total` bytes downloaded (`total` None or 0: unknown); the catalog's `Progress` callback."""
        if not self.enabled:
            return
        if total:
            pct = int(100 * done / total)
            if pct == self._last_pct:
                return
            self._last_pct = pct
            bar = "#" * (self.width * done // total)
            self._draw(f"\r[{bar:<{self.width}}] {pct:3d}% {format_size(done)} / {format_size(total)}")
        elif f"\r{format_size(done)}" != self._line:   # called again while nothing arrives: drawn once
            self._draw(f"\r{format_size(done)}")
        if total and done >= total:
            self.close()
        self.stream.flush()

    def message(self, text: str) -> None:
        """Print a line (an error) on the stream without breaking the bar, then redraw the bar under it."""
        if self.enabled:
            self.stream.write("\r" + " " * 79 + "\r")
        print(text, file=self.stream, flush=True)
        if self.enabled and self.total:
            self._draw_count(time.perf_counter() - self.start)
        elif self.enabled and self._line:
            self._draw(self._line)
            self.stream.flush()

    def close(self) -> None:
        """End the bar's line, so what follows starts on a line of its own."""
        if self.open_line:
            self.stream.write("\n")
            self.stream.flush()
            self.open_line = False

    def _draw_count(self, elapsed: float) -> None:
        frac = self.count / max(1, self.total)
        bar = "#" * int(self.width * frac)
        rate = self.count / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.count) / rate if rate > 0 else 0.0
        self._draw(f"\r[{bar:<{self.width}}] {self.count}/{self.total}  {rate:.1f} img/s  ETA {eta:.0f} s ")
        self.stream.flush()

    def _draw(self, line: str) -> None:
        self.stream.write(line)
        self._line = line
        self.open_line = True
