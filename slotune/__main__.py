"""``python -m slotune``: the command line, as the ``slotune`` script runs it."""

from slotune.cli.app import main

main()
