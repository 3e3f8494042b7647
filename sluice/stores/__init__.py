"""Where Sluice keeps state: each store an interface (``base.py``) with its backends, every SQL one written
once over ``transactions`` (SQLite or PostgreSQL, migrated by ``db``), and ``openers``, the one module
that maps settings to the store a process opens."""
