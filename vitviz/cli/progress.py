"""The CLI's one progress report: the images of `vitviz export` and the bytes of a named model's download.

On a terminal it is a bar redrawn in place; anywhere else (a log file, SLURM, nohup, CI) it is whole lines, one
per tenth of the work or half a minute, whichever comes first, so a log shows how far a run got without carriage
returns.
"""
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
        tty_only: kept for callers of the bar-only days; a stream that is not a terminal now gets lines.
    """

    LINE_EVERY_S = 30.0   # a line at least this often (besides every tenth of the work) when not on a terminal

    def __init__(self, total: int = 0, stream: TextIO | None = None, enabled: bool = True, tty_only: bool = True,
                 width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.total, self.count, self.width = total, 0, width
        is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.lines = not is_tty   # whole lines instead of a bar redrawn with '\r'
        self._last_line_t = self.start = time.perf_counter()
        self._last_tenth = 0
        self.open_line = False   # something is drawn on the current line and no newline yet
        self._last_draw = 0.0
        self._last_pct = -1
        self._line = ""

    def advance(self, n: int = 1) -> None:
        """Count `n` more images finished (done, skipped or failed) and redraw at most 10 times a second."""
        self.count += n
        now = time.perf_counter()
        if self.enabled and self.lines:
            self._line_count(now)
        elif self.enabled and (now - self._last_draw > 0.1 or self.count >= self.total):
            self._last_draw = now
            self._draw_count(now - self.start)

    def __call__(self, done: int, total: int | None) -> None:
        """`done` of `total` bytes downloaded (`total` None or 0: unknown); the catalog's `Progress` callback."""
        if not self.enabled:
            return
        if self.lines:
            self._line_bytes(done, total)
            return
        if total:
            pct = int(100 * done / total)
            if pct == self._last_pct:
                return
            self._last_pct = pct
            bar = "#" * (self.width * done // total)
            self._draw(f"\r[{bar:<{self.width}}] {pct:3d}% {format_size(done)} / {format_size(total)}")
        elif done and f"\r{format_size(done)}" != self._line:   # drawn once per size; nothing before a byte
                                                                # came (a hub that fails printed a stray '0 B')
            self._draw(f"\r{format_size(done)}")
        if total and done >= total:
            self.close()
        self.stream.flush()

    def _due(self, done: float, total: float, now: float) -> bool:
        """Whether a progress line is due: a new tenth of the work, the end, or LINE_EVERY_S since the last."""
        tenth = int(10 * done / total) if total else 0
        if not self._line and done > 0:   # the first line as soon as something arrived
            self._last_line_t = now
            return True
        if tenth > self._last_tenth or (total and done >= total) or now - self._last_line_t >= self.LINE_EVERY_S:
            self._last_tenth, self._last_line_t = max(tenth, self._last_tenth), now
            return True
        return False

    def _line_count(self, now: float) -> None:
        if not self._due(self.count, self.total, now) or self._line == f"n{self.count}":
            return
        self._line = f"n{self.count}"
        elapsed = now - self.start
        rate = self.count / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.count) / rate if rate > 0 else 0.0
        pct = 100 * self.count // max(1, self.total)
        print(f"vitviz: {self.count}/{self.total} images ({pct}%), {rate:.1f} img/s, ETA {eta:.0f} s",
              file=self.stream, flush=True)

    def _line_bytes(self, done: int, total: int | None) -> None:
        if not self._due(done, total or 0, time.perf_counter()) or self._line == f"b{done}":
            return
        self._line = f"b{done}"
        what = (f"{format_size(done)} / {format_size(total)} ({100 * done // total}%)" if total
                else format_size(done))
        print(f"vitviz: downloaded {what}", file=self.stream, flush=True)

    def message(self, text: str) -> None:
        """Print a line (an error) on the stream without breaking the bar, then redraw the bar under it."""
        if self.lines:
            print(text, file=self.stream, flush=True)
            return
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
