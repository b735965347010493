"""The ``slotune`` command line: thin typer commands over the packages."""
