"""The ``sluice`` command line: ``main.py`` holds the top-level parser and the list of command groups."""
