"""``python -m llmbench`` is the ``llmbench`` command."""

from llmbench.cli.entry import main

if __name__ == "__main__":
    main()
