"""Run vitviz from a checkout: `python main.py` does what the `vitviz` command does."""
from vitviz.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
