"""``python -m blitzq``: the same as the ``blitzq`` command."""

from .cli import main

if __name__ == "__main__":
    main()
